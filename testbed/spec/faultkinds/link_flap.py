"""``link_flap``: the link goes down for ``down_s`` (every packet dropped), then
up again."""

from __future__ import annotations

from testbed.spec.faultkinds.base import Export, Step, end, start

NAME = "link_flap"
DOC = "down_s [link]                             link down, then up"


def parse(f, base, duration_s):
    return {}, f.num("down_s", lo=0, lo_open=True, unit="s")


def actions(fault, ops):
    return [start(fault, lambda: ops.link_down(fault.link)),
            end(fault, lambda: ops.link_up(fault.link))]


def export(fault, nominal, instances, horizon_s, notes):
    return Export(step=Step(fault.at_s, min(fault.end_s, horizon_s) - fault.at_s, "partition",
                            "wan", fault.index, NAME))
