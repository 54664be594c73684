"""`testbed reproduce --seeds N`: the claims over N draws of every slot, each figure with
its interval (testbed/report/reproduce_draws.py), on run directories written the way
test_reproduce.py writes them."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.report.claims import REPRODUCED
from testbed.report.claims_load import claim_bathtub, claim_goodput
from testbed.report.reproduce import PAPER_SCALE, REPO, Slot
from testbed.report.reproduce_draws import claims_over_draws, reproduce_draws, scalar_figures
from testbed.report.seeds import t_975
from testbed.scenario.virtual import unsupported
from testbed.spec.scenario import load_scenario
from tests.unit.test_reproduce import rec, runs_of, sweep, write_run

# a draw's pdd goodput at the middle load: 9, 8, 6 of 10 against the baseline's 7
PDD_GOOD = (9, 8, 6)


def fake_run(calls):
    def run_fn(scenario: Path, out: Path, scale, offset: int) -> None:
        calls.append((scenario.name, out.parent.name, offset))
        sweep(out.parent / "tmp", {"pdd": [5, PDD_GOOD[offset], 6],
                                   "cross-dc-pd": [5, 7, 4], "same-dc-pd": [5, 7, 5]})
        (out.parent / "tmp" / "goodput-load").rename(out)
        (out.parent / "tmp").rmdir()
    return run_fn


def test_each_draw_runs_every_slot_on_its_seed_offset_and_the_figures_get_intervals(tmp_path):
    calls = []
    slots = (Slot("paper-sweep", PAPER_SCALE[0].scenario, "2 6 7 8"),)
    doc = reproduce_draws(tmp_path, 3, fake_run(calls), slots)
    assert calls == [("paper-scale-sweep.yaml", "draw-0", 0), ("paper-scale-sweep.yaml",
                     "draw-1", 1), ("paper-scale-sweep.yaml", "draw-2", 2)]
    assert all((tmp_path / f"draw-{i}" / "reproduction.md").is_file() for i in range(3))
    six = next(c for c in doc["claims"] if c["key"] == "6")
    changes = [100 * (g / 7 - 1) for g in PDD_GOOD]  # goodput at the knee vs the baseline's
    fig = six["figures"]["change_pct"]
    assert fig["values"] == pytest.approx(changes) and fig["n"] == 3
    half = t_975(2) * statistics.stdev(changes) / 3 ** 0.5
    assert fig["ci95"] == pytest.approx((statistics.fmean(changes) - half,
                                         statistics.fmean(changes) + half))
    # +28.6%, +14.3% reproduce +27.8% within half a decade; -14.3% is the other direction
    assert six["verdicts"] == {"reproduced": 2, "differs": 1} and six["verdict"] == REPRODUCED
    md = (tmp_path / "reproduction.md").read_text()
    assert "**reproduced** (2 reproduced, 1 differs of 3)" in md
    assert "change_pct 14.3 [" in md
    # the table rebuilt from the draws' run directories says the same
    again = reproduce_draws(tmp_path / "again", 0, None, slots, from_runs=tmp_path)
    assert again["claims"] == doc["claims"]


def test_one_draw_is_no_interval(tmp_path):
    with pytest.raises(Exception, match="at least 2 draws"):
        reproduce_draws(tmp_path, 1, fake_run([]), PAPER_SCALE)
    with pytest.raises(Exception, match="at least 2 draw-I folders"):
        reproduce_draws(tmp_path, 0, None, PAPER_SCALE, from_runs=tmp_path)


def test_the_bathtub_gives_one_figure_per_hit_rate_bin(tmp_path):
    hits = (0.5, 0.925, 0.995)
    modes = {}
    for h in hits:
        tag = f"b{int(h * 100):02d}"
        modes[f"pdd-{tag}"] = ("pdd", {}, [rec(i + 100 * hits.index(h), 0.5, hit=h)
                                           for i in range(4)], 10.0)
        modes[f"base-{tag}"] = ("cross-dc-pd", {}, [rec(i + 100 * hits.index(h), 1.0, hit=h)
                                                    for i in range(4)], 10.0)
    write_run(tmp_path, "paper-bathtub", modes)
    c = claim_bathtub(runs_of(tmp_path), None)
    assert c.conditions["note"].endswith("the bathtub slot's mode pairs pooled")
    figs = scalar_figures({"key": "9", "figures": c.figures})
    assert figs == {"benefit_pct[0-90]": 50.0, "benefit_pct[90-95]": 50.0,
                    "benefit_pct[99-100]": 50.0}


def test_the_paper_sweep_comes_before_the_emulated_sweeps(tmp_path):
    sweep(tmp_path, {"pdd": [5, 9, 6], "cross-dc-pd": [5, 7, 4]})
    (tmp_path / "goodput-load").rename(tmp_path / "paper-sweep")
    sweep(tmp_path, {"pdd": [5, 6, 6], "cross-dc-pd": [5, 7, 4]})
    (tmp_path / "goodput-load").rename(tmp_path / "fleet-sweep")
    assert claim_goodput(runs_of(tmp_path), None).conditions["run"] == "paper-sweep"


def test_claims_over_draws_counts_a_claim_missing_from_a_draw():
    a = {"claims": [{"key": "2", "title": "t", "published": "p", "verdict": "differs",
                     "measured": "m", "reason": "r", "figures": {"ttft_p50_s": 1.0}}]}
    b = {"claims": [{"key": "2", "title": "t", "published": "p", "verdict": "differs",
                     "measured": "m", "reason": "r", "figures": {"ttft_p50_s": None}}]}
    row = claims_over_draws([a, b])["claims"][0]
    assert row["draws"] == 2 and row["figures"]["ttft_p50_s"]["n"] == 1
    assert row["figures"]["ttft_p50_s"]["ci95"] is None


@pytest.mark.parametrize("slot", PAPER_SCALE, ids=lambda s: s.name)
def test_the_paper_scale_slots_are_virtual_clock_scenarios(slot):
    sc = load_scenario(REPO / slot.scenario)
    assert sc.clock == "virtual" and unsupported(sc) == [] and sc.scale == 1


def test_cli_rebuilds_the_table_over_draws(tmp_path, capsys):
    reproduce_draws(tmp_path / "runs", 2, fake_run([]), (Slot("paper-sweep", "x", "6"),))
    assert main(["reproduce", "--from-runs", str(tmp_path / "runs"), "--out",
                 str(tmp_path / "out")]) == 0
    doc = json.loads((tmp_path / "out" / "reproduction.json").read_text())
    assert doc["draws"] == 2 and (tmp_path / "out" / "draw-1" / "reproduction.md").is_file()
    assert [s["name"] for s in doc["slots"]] == ["paper-sweep"]  # the slots the draws ran
    assert "goodput within SLA" in capsys.readouterr().out


def test_a_run_that_raises_is_named_and_the_other_draws_still_count(tmp_path):
    from testbed.errors import TestbedError

    good = fake_run([])

    def run_fn(scenario, out, scale, offset):
        if offset == 1:
            raise TestbedError("the network model refused it")
        good(scenario, out, scale, offset)

    doc = reproduce_draws(tmp_path, 3, run_fn, (Slot("paper-sweep", "x", "6"),))
    assert doc["errors"] == {"draw-1/paper-sweep": "TestbedError: the network model refused it"}
    six = next(c for c in doc["claims"] if c["key"] == "6")
    assert six["figures"]["change_pct"]["n"] == 2 and six["verdicts"]["not reproducible here"] == 1
    assert "draw-1/paper-sweep: TestbedError" in (tmp_path / "reproduction.md").read_text()


def test_claim_8_gives_its_highest_load_and_rlds_peak_memory():
    figs = {"points": [{"e2e_ratio": 1.1, "p_rld_kv_waited": 0},
                       {"e2e_ratio": 1.4, "p_rld_kv_waited": 3}],
            "breaks_at_rps": None, "rld_peak": {"kv_tokens": 50, "kv_capacity_tokens": 200}}
    assert scalar_figures({"key": "8", "figures": figs}) == {
        "top_load_e2e_ratio": 1.4, "top_load_p_rld_kv_waited": 3.0, "rld_peak_kv_share": 0.25}
