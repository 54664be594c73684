"""``bandwidth``: the link's rate steps to ``rate_gbit`` (back at the end of
``duration_s``, when given)."""

from __future__ import annotations

from testbed.spec.faultkinds.base import Export, set_link_actions, wan_set

NAME = "bandwidth"
DOC = "rate_gbit [link] [duration_s]             one step"
RATE = dict(lo=0, lo_open=True, hi=1000.0, unit="Gbit/s")


def parse(f, base, duration_s):
    return {"rate_gbit": f.num("rate_gbit", **RATE)}, duration_s


def actions(fault, ops):
    return set_link_actions(fault, ops, rate_gbit=fault.params["rate_gbit"])


def export(fault, nominal, instances, horizon_s, notes):
    return Export(wan=wan_set(fault, nominal, {"rate_gbit": fault.params["rate_gbit"]}))
