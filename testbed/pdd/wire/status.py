"""The periodic status REPORTs (request id 0) that the router's models read, typed.

Owns ``WanStatus`` (MD -> router, every ``main.wan_status_interval_s``: what
MD read from P's connections, for the router's WanModel) and ``TcpStatus``
(P -> router, every ``prefill.tcp_status_interval_s``: its connections' TCP
counters, for the router's loss meter). The writer builds one and sends
``data()`` as a REPORT's data; the reader calls ``read`` on what arrived,
which checks every field (ValueError naming it), so writer and reader share
one declaration of each field.

Example::

    Report(Role.MAIN_DECODE, "md1", WanStatus(0.1, 4096, True, {7: 100}, {}).data())
    WanStatus.read(report.data).rx_bytes
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping


def _num(data: Mapping, key: str, kind: type = float, lo: float = 0.0) -> float:
    value = data.get(key)
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and value >= lo and (kind is float or value == int(value)))
    if not ok:
        raise ValueError(f"{key}: expected a finite {kind.__name__} >= {lo:g}, got {value!r}")
    return kind(value)


def _by_rid(data: Mapping, key: str) -> dict[int, float]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}: expected an object of request id -> number, got {value!r}")
    out = {}
    for rid, v in value.items():
        if not str(rid).isdigit():
            raise ValueError(f"{key}: request id {rid!r} is not a number")
        out[int(rid)] = _num(value, rid)
    return out


@dataclass(frozen=True)
class WanStatus:
    """MD's WAN status for one interval."""

    KIND = "wan"
    interval_s: float            # the interval's length
    rx_bytes: int                # bytes read from P's connections in it (wire units)
    busy: bool                   # a KV transfer was receiving throughout the interval
    pending: dict[int, float] = field(default_factory=dict)  # rid -> wire bytes still missing
    kv_done: dict[int, float] = field(default_factory=dict)  # rid -> its KV_DONE (monotonic)

    def data(self) -> dict:
        return {"kind": self.KIND, "interval_s": self.interval_s, "rx_bytes": self.rx_bytes,
                "busy": self.busy, "pending": {str(k): v for k, v in self.pending.items()},
                "kv_done": {str(k): v for k, v in self.kv_done.items()}}

    @classmethod
    def read(cls, data: Mapping) -> "WanStatus":
        if data.get("kind") != cls.KIND:
            raise ValueError(f"kind: expected {cls.KIND!r}, got {data.get('kind')!r}")
        if not isinstance(data.get("busy"), bool):
            raise ValueError(f"busy: expected true or false, got {data.get('busy')!r}")
        return cls(_num(data, "interval_s"), _num(data, "rx_bytes", int), data["busy"],
                   _by_rid(data, "pending"), _by_rid(data, "kv_done"))


@dataclass(frozen=True)
class TcpStatus:
    """P's TCP counters toward the MDs for one interval (the kernel's TCP_INFO, summed)."""

    KIND = "tcp"
    interval_s: float
    segs_out: int    # segments sent in the interval
    retrans: int     # of which retransmitted
    rto_s: float     # the largest current retransmission timeout

    def data(self) -> dict:
        return {"kind": self.KIND, "interval_s": self.interval_s, "segs_out": self.segs_out,
                "retrans": self.retrans, "rto_s": self.rto_s}

    @classmethod
    def read(cls, data: Mapping) -> "TcpStatus":
        if data.get("kind") != cls.KIND:
            raise ValueError(f"kind: expected {cls.KIND!r}, got {data.get('kind')!r}")
        return cls(_num(data, "interval_s"), _num(data, "segs_out", int),
                   _num(data, "retrans", int), _num(data, "rto_s"))
