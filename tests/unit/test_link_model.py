"""One impairment model: LinkSpec validated when built, overrides keep asymmetry,
the rtt fault's one-way field, and errors that end as one line and exit 2."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from testbed import cli
from testbed.errors import EmulationError, PlanError, SpecError
from testbed.impairment import JITTER_DISTRIBUTIONS, LOSS_MODELS, LossSpec
from testbed.net import naming
from testbed.net.build import make_plan
from testbed.net.encoders import delay_params, netem_params
from testbed.net.impairments import JitterDistribution, LossModel
from testbed.net.shaping import Backend
from testbed.spec.scenario import parse_scenario
from testbed.spec.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
MULTI_HOST = ROOT / "topologies" / "multi-host.yaml"
SCENARIO = {
    "name": "s", "topology": "../topologies/multi-host.yaml", "modes": ["pdd"],
    "workload": {"kind": "synthetic", "seed": 1, "n_requests": 10,
                 "arrival": {"process": "poisson", "rate_rps": 2},
                 "input_len": {"dist": "fixed", "tokens": 256},
                 "output_len": {"dist": "fixed", "tokens": 32},
                 "hit_rate": {"mean_pct": 90}},
}
FILE = str(ROOT / "scenarios" / "test.yaml")


@pytest.mark.parametrize("change, field", [
    ({"delay_ms": -1.0}, "delay_ms"),
    ({"jitter_ms": float("nan")}, "jitter_ms"),
    ({"rate_gbit": 0.0}, "rate_gbit"),
    ({"jitter_distribution": "gauss"}, "jitter_distribution"),
    ({"reorder_pct": 5.0, "delay_ms": 0.0}, "reorder_pct"),
    ({"queue_limit_pkts": 0}, "queue_limit_pkts"),
    ({"loss": 1.0}, "loss"),  # a LossSpec, not a number
])
def test_no_way_builds_an_invalid_link(change, field):
    topo = load_topology(MULTI_HOST)
    for build in (lambda: topo.wan.a_to_b.replace(**change), lambda: topo.with_wan(**change)):
        with pytest.raises(SpecError) as ei:
            build()
        assert ei.value.path == field


def test_loss_spec_rules_hold_in_its_constructor():
    with pytest.raises(SpecError, match="loss.model"):
        LossSpec("bursty")
    with pytest.raises(SpecError, match="loss.r_pct"):
        LossSpec("gilbert_elliott", p_pct=5.0, r_pct=0.0)
    with pytest.raises(SpecError, match="loss.pct"):
        LossSpec("gilbert_elliott", pct=1.0, p_pct=5.0)


def test_one_list_of_distributions_and_loss_models():
    assert tuple(JitterDistribution) == JITTER_DISTRIBUTIONS
    assert tuple(LossModel) == LOSS_MODELS


def test_both_encodings_come_from_the_plans_one_stage():
    topo = load_topology(ROOT / "topologies" / "long-haul-lossy.yaml")
    for backend in Backend:
        imp = make_plan(topo, backend, prefix="tb0000").channel("wan/a>b").impairment
        n, d = netem_params(imp), delay_params(imp)
        assert n.delay_us == round(imp.delay_ms * 1000) and d.delay_ms == imp.delay_ms
        assert n.limit_pkts == d.limit_pkts == imp.limit_pkts
        assert n.seed == d.seed == imp.seed
        assert n.loss_model == d.loss_model == imp.loss.model


def test_a_wan_override_keeps_an_asymmetric_link():
    topo = load_topology(MULTI_HOST)
    assert (topo.wan.a_to_b.rate_gbit, topo.wan.b_to_a.rate_gbit) == (100.0, 40.0)
    data = copy.deepcopy(SCENARIO)
    data["wan"] = {"delay_ms": 20}
    wan = parse_scenario(data, FILE).topology.wan
    assert (wan.a_to_b.rate_gbit, wan.b_to_a.rate_gbit) == (100.0, 40.0)
    assert (wan.a_to_b.delay_ms, wan.b_to_a.delay_ms) == (20.0, 20.0)
    data["wan"] = {"rate_gbit": 10, "loss_pct": 1}
    wan = parse_scenario(data, FILE).topology.wan
    assert (wan.a_to_b.rate_gbit, wan.b_to_a.rate_gbit) == (10.0, 10.0)
    assert wan.b_to_a.loss == LossSpec("random", pct=1.0)
    assert wan.b_to_a.delay_ms == topo.wan.b_to_a.delay_ms


def test_the_rtt_fault_takes_a_one_way_delay_and_names_the_old_field():
    data = copy.deepcopy(SCENARIO)
    data["faults"] = [{"at_s": 1, "kind": "rtt", "one_way_delay_ms": 40, "duration_s": 2}]
    (fault,) = parse_scenario(data, FILE).faults
    assert fault.params["one_way_delay_ms"] == 40.0
    data["faults"] = [{"at_s": 1, "kind": "rtt", "delay_ms": 40}]
    with pytest.raises(SpecError, match="faults.*delay_ms.*one_way_delay_ms") as ei:
        parse_scenario(data, FILE)
    assert ei.value.file == FILE


def test_scale_below_one_is_a_plan_error():
    with pytest.raises(PlanError, match="--scale"):
        make_plan(load_topology(MULTI_HOST), Backend.NETEM, 0.5, prefix="tb0000")


def test_no_free_run_prefix_is_an_emulation_error(tmp_path, monkeypatch):
    monkeypatch.setattr(naming, "STATE_DIR", tmp_path)
    monkeypatch.setattr(naming.secrets, "token_hex", lambda n: "abcd")
    (tmp_path / "tbabcd.json").write_text("{}")
    with pytest.raises(EmulationError, match="free run prefix"):
        naming.new_run_prefix()


@pytest.mark.parametrize("argv, words", [
    (["plan", "--scale", "0.5"], "--scale"),
    (["calibrate", "--wan-rtt-ms", "-5"], "--wan-rtt-ms"),
    (["calibrate", "--wan-rate-gbit", "0"], "--wan-rate-gbit"),
    (["calibrate", "--wan-loss-pct", "200"], "--wan-loss-pct"),
    (["calibrate", "--wan-rtt-ms", "nan"], "--wan-rtt-ms"),
])
def test_bad_numbers_on_the_command_line_exit_2_with_one_line(argv, words, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err
