"""Fault kinds as modules: the registry finds each one, every kind is whole (parse,
runner actions, Chaos Mesh translation, its reference line), one fault-event shape for
the runner, the cluster collector and the report, and the ``duplicate`` kind end to end
as data (YAML -> actions -> the link plan -> the Workflow)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from testbed.errors import SpecError
from testbed.export.chaos import ChaosContext, netem_spec
from testbed.export.timeline import translate
from testbed.report.events import describe, fault_key, fault_kind
from testbed.spec import faultkinds
from testbed.spec.faultkinds import FAULT_KINDS, KINDS
from testbed.spec.faultkinds.base import Export, FaultSpec
from testbed.spec.faults import parse_faults
from testbed.reader import Fields
from testbed.spec.topology import load_topology
from testbed.types import FaultEvent

ROOT = Path(__file__).resolve().parents[2]
TWO_DC = load_topology(ROOT / "topologies" / "two-dc.yaml")
ROLES = {"main_decode": ["md1", "md2"], "relay_decode": ["rld1"], "prefill": ["p1"]}


def _parse(*items: dict) -> tuple[FaultSpec, ...]:
    return parse_faults(Fields({"faults": list(items)}, "s.yaml", ""), "faults", ROOT)


def test_the_registry_is_the_modules_of_the_package():
    files = {p.stem for p in Path(faultkinds.__file__).parent.glob("*.py")} - {"__init__", "base"}
    assert {m.__name__.rsplit(".", 1)[1] for m in KINDS.values()} == files
    assert set(FAULT_KINDS) == {m.NAME for m in KINDS.values()}
    assert "duplicate" in FAULT_KINDS


@pytest.mark.parametrize("name", FAULT_KINDS)
def test_every_kind_is_whole(name):
    module = KINDS[name]
    assert module.__doc__ and module.DOC.strip()
    assert f"{name:<12} " in faultkinds.reference()
    for fn in ("parse", "actions", "export"):
        assert callable(getattr(module, fn))
    # the scenario reference of the spec module and the design doc name every kind
    assert f"    {name} " in (ROOT / "testbed" / "spec" / "faults.py").read_text()
    assert f"`{name}`" in (ROOT / "docs" / "design.md").read_text()


def test_an_unknown_kind_names_the_known_ones():
    with pytest.raises(KeyError, match="known: bandwidth"):
        faultkinds.kind("earthquake")
    with pytest.raises(SpecError, match=r"faults\[0\]\.kind"):
        _parse({"at_s": 1, "kind": "earthquake"})


# --- one fault-event shape -----------------------------------------------------------

def test_a_fault_event_reads_back_what_was_recorded():
    fe = FaultEvent("end", 3, "loss", "wan", {"pct": 1.0})
    rec = {"t_mono": 5.0, "t_wall": 1.0, **fe.record()}
    assert rec["kind"] == "fault_end" and rec["fault_kind"] == "loss" and rec["pct"] == 1.0
    assert FaultEvent.read(rec) == fe
    assert FaultEvent.read({"kind": "set_link", "t_mono": 1.0}) is None
    with pytest.raises(ValueError, match="edge"):
        FaultEvent("middle", 0, "loss")
    with pytest.raises(ValueError, match="names the record itself uses"):
        FaultEvent("start", 0, "loss", params={"kind": "x"})


def test_runner_and_collector_events_read_the_same_for_the_report():
    from testbed.export.collect import _events
    from testbed.scenario.faults import actions_for

    recorded = []
    events = type("E", (), {"record": lambda self, kind, **kw: recorded.append(
        {"t_mono": 20.0, "kind": kind, **kw})})()
    from testbed.impairment import LinkSpec
    wan = type("C", (), {"link": "wan", "id": "wan/a>b", "spec": LinkSpec(10.0)})()
    net = type("N", (), {"channels": {"wan/a>b": wan}, "events": events})()
    roles = type("R", (), {"kill": lambda *a: None, "restart": lambda *a: None})()
    fault = FaultSpec(0, 20.0, "restart", duration_s=10.0,
                      params={"role": "main_decode", "instance": "md1"})
    for a in actions_for(fault, net, roles):
        a.run()
    mode = {"name": "pdd", "steps": [{"at_s": 20.0, "duration_s": 10.0, "action": "pod-failure",
                                      "fault_kind": "restart", "target": "md1", "fault": 0}]}
    planned = [e for e in _events({"t_start_mono": 0.0}, mode) if e["kind"].startswith("fault")]
    for runner_event, cluster_event in zip(recorded, planned, strict=True):
        assert runner_event["kind"] == cluster_event["kind"]
        assert fault_key(runner_event) == fault_key(cluster_event) == 0
        assert fault_kind(runner_event) == fault_kind(cluster_event) == "restart"
    assert describe(planned[0], 0.0) == ("+20.0 s fault_start 0 restart (link=wan, "
                                         "action=pod-failure, target=md1, planned=True)")
    assert describe(recorded[0], 0.0) == ("+20.0 s fault_start 0 restart (link=wan, "
                                          "role=main_decode, instance=md1)")


# --- the duplicate kind --------------------------------------------------------------

def test_duplicate_parses_and_bad_values_name_the_field():
    (f,) = _parse({"at_s": 5, "kind": "duplicate", "pct": 2.5, "duration_s": 10})
    assert (f.kind, f.params, f.duration_s, f.link) == ("duplicate", {"pct": 2.5}, 10.0, "wan")
    for bad in (-1, 101, "lots"):
        with pytest.raises(SpecError, match=r"faults\[0\]\.pct"):
            _parse({"at_s": 5, "kind": "duplicate", "pct": bad})


def test_duplicate_sets_and_restores_only_that_field():
    calls = []
    ops = type("O", (), {"set_link": lambda self, link, **kw: calls.append(("set", link, kw)),
                         "restore": lambda self, link, *f: calls.append(("restore", link, f))})()
    (f,) = _parse({"at_s": 5, "kind": "duplicate", "pct": 2.5, "duration_s": 10, "link": "wan/a>b"})
    actions = KINDS["duplicate"].actions(f, ops)
    assert [(a.at_s, a.starts, a.ends) for a in actions] == [(5.0, 0, None), (15.0, None, 0)]
    for a in actions:
        a.run()
    assert calls == [("set", "wan/a>b", {"duplicate_pct": 2.5}),
                     ("restore", "wan/a>b", ("duplicate_pct",))]


def test_duplicate_is_a_netem_field_of_the_exported_wan():
    (f,) = _parse({"at_s": 5, "kind": "duplicate", "pct": 2.5, "duration_s": 10})
    tl = translate((f,), TWO_DC.wan, ROLES, 100.0)
    assert [(s.start_s, s.end_s, s.a_to_b.duplicate_pct, s.b_to_a.duplicate_pct)
            for s in tl.wan] == [(0.0, 5.0, 0.0, 0.0), (5.0, 15.0, 2.5, 2.5),
                                 (15.0, 100.0, 0.0, 0.0)]
    ctx = ChaosContext("ns", "a", "b", "http://c:8080", {})
    assert netem_spec(ctx, tl.wan[1].a_to_b, "a", "b", "both")["duplicate"] == {
        "duplicate": "2.5", "correlation": "0"}
    assert "duplicate" not in netem_spec(ctx, tl.wan[0].a_to_b, "a", "b", "both")


def test_a_link_can_duplicate_from_the_topology_on():
    from testbed.impairment import LinkSpec
    from testbed.spec.link import parse_link

    link = parse_link(Fields({"rate_gbit": 10, "delay_ms": 5, "duplicate_pct": 1}, "t.yaml", "wan.link"))
    assert link.duplicate_pct == 1.0
    with pytest.raises(SpecError, match="duplicate_pct"):
        LinkSpec(10.0, duplicate_pct=150.0)
    with pytest.raises(SpecError, match=r"wan\.link\.duplicate_pct"):
        parse_link(Fields({"rate_gbit": 10, "duplicate_pct": -2}, "t.yaml", "wan.link"))


def test_each_kind_exports_plain_data():
    faults = _parse({"at_s": 1, "kind": "bandwidth", "rate_gbit": 2, "duration_s": 1},
                    {"at_s": 2, "kind": "rtt", "one_way_delay_ms": 40, "duration_s": 1},
                    {"at_s": 3, "kind": "loss", "pct": 1, "duration_s": 1},
                    {"at_s": 4, "kind": "duplicate", "pct": 1, "duration_s": 1},
                    {"at_s": 5, "kind": "link_flap", "down_s": 1},
                    {"at_s": 6, "kind": "congestion", "flows": 2, "duration_s": 1},
                    {"at_s": 7, "kind": "kill", "role": "prefill"},
                    {"at_s": 8, "kind": "restart", "role": "relay_decode", "down_s": 1},
                    {"at_s": 9, "kind": "bandwidth_schedule",
                     "steps": [{"at_s": 0, "rate_gbit": 1}]})
    assert {f.kind for f in faults} == set(FAULT_KINDS)
    tl = translate(faults, TWO_DC.wan, ROLES, 100.0)
    assert [(s.fault_kind, s.action, s.target) for s in tl.steps] == [
        ("link_flap", "partition", "wan"), ("congestion", "cross-traffic", "a>b"),
        ("kill", "pod-failure", "p1"), ("restart", "pod-failure", "rld1")]
    for f in faults:
        part = KINDS[f.kind].export(f, _nominal(), ROLES, 100.0, [])
        assert isinstance(part, Export) and (part.wan or part.step), f.kind
        json.dumps(dataclasses.asdict(part))  # plain data: nothing live, nothing callable
        assert all(c.fault == f.index for c in part.wan), f.kind


def _nominal():
    from testbed.spec.faultkinds.base import Nominal

    return Nominal({"rate_gbit": (10.0, 10.0), "delay_ms": (10.0, 10.0), "jitter_ms": (0.0, 0.0),
                    "loss_pct": (0.0, 0.0), "duplicate_pct": (0.0, 0.0)})
