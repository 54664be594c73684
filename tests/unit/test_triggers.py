"""Faults triggered by protocol events: the trigger on recorded event streams
(testbed/spec/triggers.py), the runner's tail of the events files and the shift of a
fault's actions to the firing event (testbed/scenario/triggers.py), and the roles
writing those events at the moments they name (live loopback processes).

The recorded streams: fixtures/events/loopback-pdd.events.jsonl, what P, RLD and MD of a
loopback pdd cluster wrote for 8 relayed requests (``python -m testbed.pdd.run.node
--events``, merged in time order); fixtures/events/event-faults.events.jsonl, what the
roles of ``testbed run scenarios/event-faults.yaml`` wrote (2026-12-06, commit b2bc279),
with the runner's ``fault_trigger`` records of that run in event-faults.triggers.jsonl."""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from pathlib import Path

import pytest
from pdd_fixtures import small_config

from testbed.pdd.roles.client import Client
from testbed.pdd.roles.client_record import ClientRequest
from testbed.pdd.run.procs import RoleProcesses, loopback_config
from testbed.pdd.wire.transport import TcpTransport
from testbed.scenario.triggers import EventTail, TriggeredFaults
from testbed.spec.faultkinds.base import Action, FaultSpec
from testbed.spec.triggers import Trigger, TriggerCounter, firing
from testbed.types import PROTOCOL_EVENTS

STREAM = Path(__file__).parent / "fixtures" / "events" / "loopback-pdd.events.jsonl"
EVENTS = [json.loads(line) for line in STREAM.read_text().splitlines()]


def test_replaying_a_runs_stream_fires_each_trigger_on_the_event_the_runner_fired_on():
    """Offline, the triggers of scenarios/event-faults.yaml fire on exactly the events the
    live runner recorded; the run's MD and RLD restarts are in the stream (their files
    appended), so the counts go on across them."""
    from testbed.spec.scenario import load_scenario
    root = Path(__file__).resolve().parents[2]
    faults = load_scenario(root / "scenarios" / "event-faults.yaml").faults
    stream = [json.loads(line) for line in
              (STREAM.parent / "event-faults.events.jsonl").read_text().splitlines()]
    live = [json.loads(line) for line in
            (STREAM.parent / "event-faults.triggers.jsonl").read_text().splitlines()]
    for rec in live:
        ev = firing(faults[rec["fault"]].trigger, stream)
        assert (ev["event"], ev["name"], ev["rid"], ev["t"]) == \
            (rec["event"], rec["source"], rec["rid"], rec["t_event"])


def test_the_nth_matching_event_fires_and_only_once():
    halves = [e for e in EVENTS if e["event"] == "kv_transfer_half"]
    assert len(halves) == 8
    assert firing(Trigger("kv_transfer_half", nth=3), EVENTS) is halves[2]
    counter = TriggerCounter(Trigger("kv_transfer_half", nth=3))
    fired = [e for e in EVENTS if counter.feed(e)]
    assert fired == [halves[2]] and counter.seen == 3


def test_a_source_narrows_what_counts():
    assert firing(Trigger("kv_done", nth=1, source="md0"), EVENTS)["name"] == "md0"
    assert firing(Trigger("kv_done", nth=1, source="main_decode"), EVENTS) is not None
    assert firing(Trigger("kv_done", nth=1, source="prefill"), EVENTS) is None
    assert firing(Trigger("handoff_final", nth=9), EVENTS) is None  # only 8 in the stream


def test_a_trigger_names_a_known_event_and_a_positive_count():
    with pytest.raises(ValueError, match="one of handoff_sent"):
        Trigger("handoff_started")
    with pytest.raises(ValueError, match="nth 0"):
        Trigger("kv_done", nth=0)


def test_the_recorded_events_come_in_the_protocols_order():
    """Per request: P's transfer mid-way before MD holds the KV; the final HANDOFF
    batch sent once, as the last handoff event of the request."""
    by_rid = defaultdict(list)
    for e in EVENTS:
        assert e["event"] in PROTOCOL_EVENTS
        by_rid[e["rid"]].append(e["event"])
    for rid, seq in by_rid.items():
        assert seq.index("kv_transfer_half") < seq.index("kv_done"), (rid, seq)
        handoffs = [s for s in seq if s.startswith("handoff")]
        assert handoffs[-1] == "handoff_final" and handoffs.count("handoff_final") == 1


def _fault(trigger: Trigger, index: int = 0) -> FaultSpec:
    return FaultSpec(index, trigger.delay_s, "link_flap", "wan", 2.0, {}, trigger)


def test_a_fired_fault_runs_its_actions_timed_from_the_event(tmp_path):
    """Lines written a few at a time (one cut mid-line); the fault's start comes
    delay_s after its event, its end duration_s after that, on the workload's clock."""
    trig = Trigger("handoff_sent", nth=2, delay_s=0.05)
    fault = _fault(trig)
    acts = [Action(fault.at_s, "flap start", lambda: None, starts=0),
            Action(fault.end_s, "flap end", lambda: None, ends=0)]
    recorded = []

    class Log:
        def record(self, kind, **fields):
            recorded.append({"kind": kind, **fields})

    faults = TriggeredFaults([(fault, acts)], EventTail(tmp_path), Log())
    path, t0 = tmp_path / "rld0.events.jsonl", EVENTS[0]["t"] - 10.0
    text = "".join(json.dumps(e) + "\n" for e in EVENTS)
    second = [e for e in EVENTS if e["event"] == "handoff_sent"][1]
    got, written = [], 0
    for cut in range(0, len(text) + 97, 97):  # 97-byte pieces: lines arrive cut in two
        with path.open("a") as f:
            f.write(text[written:cut])
        written = min(cut, len(text))
        got += faults.poll(t0)
    assert [a.label for a in got] == ["flap start", "flap end"] and not faults.pending
    assert got[0].at_s == pytest.approx(second["t"] - t0 + 0.05)
    assert got[1].at_s == pytest.approx(second["t"] - t0 + 2.05)
    assert recorded[0]["kind"] == "fault_trigger" and recorded[0]["rid"] == second["rid"]


def test_a_trigger_that_never_fires_is_recorded(tmp_path):
    recorded = []

    class Log:
        def record(self, kind, **fields):
            recorded.append({"kind": kind, **fields})

    faults = TriggeredFaults([(_fault(Trigger("kv_done", nth=100)), [])],
                             EventTail(tmp_path), Log())
    (tmp_path / "md0.events.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in EVENTS))
    assert faults.poll(0.0) == [] and faults.pending
    faults.untriggered()
    assert recorded == [{"kind": "fault_untriggered", "fault": 0, "fault_kind": "link_flap",
                         "trigger": "on kv_done #100", "seen": 8}]


def test_live_roles_write_each_event_at_its_moment(tmp_path):
    """A loopback cluster with events files: every relayed request gives P's
    kv_transfer_half before MD's kv_done, and RLD's handoff_final."""
    cfg = loopback_config(small_config("pdd", "catch-up", router={"relay_threshold_s": 0.0},
                                       timing={"connect_timeout_s": 20.0}))
    rng = random.Random(5)
    reqs = [ClientRequest(i, 0.2 * i, tuple(rng.randrange(512) for _ in range(120)), 40,
                          f"s{i}") for i in range(3)]
    with RoleProcesses(cfg, tmp_path, events=True) as procs:
        procs.start()
        records = asyncio.run(Client(cfg, TcpTransport(), "client").run(reqs))
    assert [r["pipeline"] for r in records] == ["p-rld-md"] * 3
    events = EventTail(tmp_path).read()
    by_rid = defaultdict(dict)
    for e in events:
        by_rid[e["rid"]].setdefault(e["event"], e)
    assert len(by_rid) == 3
    for got in by_rid.values():
        assert got["kv_transfer_half"]["name"] == "p0" and got["kv_done"]["name"] == "md0"
        assert got["kv_transfer_half"]["t"] <= got["kv_done"]["t"]
        assert got["handoff_final"]["name"] == "rld0"
