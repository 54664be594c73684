"""Reading events.jsonl records: which fault an event belongs to and what it was.

Owns ``fault_key``, ``fault_kind``, ``workload_t0`` and ``describe``, shared by
the plots (fault spans, event lines) and report.md (the fault timeline).
docs/run-directory.md gives fault events a fault index, a kind and params
but the event's own ``kind`` is ``fault_start``/``fault_end``, so the fault's
kind is read from ``fault_kind``, a nested ``fault`` object, or ``params.kind``.

Example::

    fault_key({"kind": "fault_start", "fault": 0, "fault_kind": "bandwidth"})   # 0
    describe(event, t0)   # "+4.0 s fault_start 0 bandwidth (rate_gbit=2)"
"""

from __future__ import annotations

from typing import Mapping, Sequence

FAULT_KINDS = ("fault_start", "fault_end")
# Event kinds worth listing in the report's timeline (shape/network_up are set-up noise).
TIMELINE_KINDS = FAULT_KINDS + ("set_link", "link_down", "link_up", "cross_traffic_start",
                                "cross_traffic_stop", "process_kill", "process_restart")
_PLAIN = {"t_mono", "t_wall", "kind", "fault", "index", "fault_kind", "params"}


def fault_key(event: Mapping) -> object:
    """The fault index of a fault_start/fault_end event (None if absent)."""
    f = event.get("fault", event.get("index"))
    return f.get("index") if isinstance(f, Mapping) else f


def fault_kind(event: Mapping) -> str:
    """The fault's own kind, '' if the event does not say."""
    f = event.get("fault")
    nested = f.get("kind") if isinstance(f, Mapping) else None
    return str(event.get("fault_kind") or nested or (event.get("params") or {}).get("kind") or "")


def workload_t0(events: Sequence[Mapping]) -> float | None:
    starts = [e["t_mono"] for e in events if e.get("kind") == "workload_start"]
    return min(starts) if starts else None


def describe(event: Mapping, t0: float) -> str:
    """One line for the report: time from t0, kind, fault identity, other fields."""
    kind = event.get("kind")
    parts = [f"{event['t_mono'] - t0:+.1f} s", str(kind)]
    if kind in FAULT_KINDS:
        key = fault_key(event)
        parts += [x for x in ("" if key is None else str(key), fault_kind(event)) if x]
    fields = {k: v for k, v in event.items() if k not in _PLAIN}
    fields.update({k: v for k, v in (event.get("params") or {}).items() if k != "kind"})
    if fields:
        parts.append("(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")")
    return " ".join(parts)
