"""Reading events.jsonl records: which fault an event belongs to and what it was.

Owns ``fault_key``, ``fault_kind``, ``workload_t0`` and ``describe``, shared by
the plots (fault spans, event lines) and report.md (the fault timeline).
A fault's start and end have one shape, ``testbed.types.FaultEvent``,
whether the single-machine runner wrote them or the cluster collector
(``planned`` times from the Workflow).

Example::

    fault_key({"kind": "fault_start", "fault": 0, "fault_kind": "bandwidth"})   # 0
    describe(event, t0)   # "+4.0 s fault_start 0 bandwidth (link=wan, rate_gbit=2)"
"""

from __future__ import annotations

from typing import Mapping, Sequence

from testbed.types import FaultEvent

FAULT_EVENTS = ("fault_start", "fault_end")
# Event kinds worth listing in the report's timeline (shape/network_up are set-up noise).
TIMELINE_KINDS = FAULT_EVENTS + ("set_link", "link_down", "link_up", "cross_traffic_start",
                                 "cross_traffic_stop", "process_kill", "process_restart")
_PLAIN = {"t_mono", "t_wall", "kind"}


def fault_key(event: Mapping) -> int | None:
    """The fault index of a fault_start/fault_end event (None if it is none)."""
    fe = FaultEvent.read(event)
    return None if fe is None else fe.fault


def fault_kind(event: Mapping) -> str:
    """The fault's own kind (bandwidth, kill...), '' if the event is no fault event."""
    fe = FaultEvent.read(event)
    return "" if fe is None else fe.fault_kind


def workload_t0(events: Sequence[Mapping]) -> float | None:
    starts = [e["t_mono"] for e in events if e.get("kind") == "workload_start"]
    return min(starts) if starts else None


def describe(event: Mapping, t0: float) -> str:
    """One line for the report: time from t0, kind, fault identity, other fields."""
    parts = [f"{event['t_mono'] - t0:+.1f} s", str(event.get("kind"))]
    fe = FaultEvent.read(event)
    if fe is not None:
        parts += [str(fe.fault), fe.fault_kind] if fe.fault_kind else [str(fe.fault)]
        fields = {"link": fe.link, **fe.params, **({"planned": True} if fe.planned else {})}
    else:
        fields = {k: v for k, v in event.items() if k not in _PLAIN}
    if fields:
        parts.append("(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")")
    return " ".join(parts)
