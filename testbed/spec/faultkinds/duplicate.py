"""``duplicate``: the link sends ``pct`` percent of its packets twice (netem's
``duplicate``; the delay line's copy takes its own delay draw, as netem's
does). A duplicated TCP segment reaches the receiver twice and is dropped
there as a duplicate: what it costs is link capacity and the receiver's
duplicate ACKs (D-SACK), which a sender must not read as loss."""

from __future__ import annotations

from testbed.spec.faultkinds.base import Export, set_link_actions, wan_set

NAME = "duplicate"
DOC = "pct [link] [duration_s]                   packets sent twice"


def parse(f, base, duration_s):
    return {"pct": f.num("pct", lo=0, hi=100, unit="percent")}, duration_s


def actions(fault, ops):
    return set_link_actions(fault, ops, duplicate_pct=fault.params["pct"])


def export(fault, nominal, instances, horizon_s, notes):
    return Export(wan=wan_set(fault, nominal, {"duplicate_pct": fault.params["pct"]}))
