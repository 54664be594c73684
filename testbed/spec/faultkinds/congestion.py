"""``congestion``: ``flows`` TCP cross flows over the WAN in ``direction`` for
``duration_s`` (iperf3-like bulk senders between the datacenters' spare hosts)."""

from __future__ import annotations

from testbed.spec.faultkinds.base import Export, Step, end, start

NAME = "congestion"
DOC = "flows [direction a>b|b>a] duration_s      N TCP cross flows"


def parse(f, base, duration_s):
    p = {"flows": f.int("flows", lo=1, hi=64),
         "direction": f.choice("direction", ("a>b", "b>a"), "a>b")}
    if duration_s is None:
        raise f.error("duration_s", "a duration for congestion", None)
    return p, duration_s


def actions(fault, ops):
    held: dict = {}
    p = fault.params
    return [start(fault, lambda: held.setdefault("flows", ops.cross_traffic(p["flows"],
                                                                             p["direction"]))),
            end(fault, lambda: held["flows"].stop() if "flows" in held else None)]


def export(fault, nominal, instances, horizon_s, notes):
    p = fault.params
    return Export(step=Step(fault.at_s, min(fault.end_s, horizon_s) - fault.at_s,
                            "cross-traffic", p["direction"], fault.index, NAME, p["flows"]))
