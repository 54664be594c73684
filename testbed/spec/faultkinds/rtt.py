"""``rtt``: each direction's one-way delay (and jitter) becomes
``one_way_delay_ms`` (the RTT of ``wan`` becomes twice it)."""

from __future__ import annotations

from testbed.spec.faultkinds.base import Export, set_link_actions, wan_set

NAME = "rtt"
DOC = ("one_way_delay_ms [jitter_ms] [link] [duration_s]  each direction's\n"
       "                 one-way delay/jitter (the RTT of \"wan\" becomes 2 x one_way_delay_ms)")


def parse(f, base, duration_s):
    if f.has("delay_ms"):  # the name before: it read as the RTT to some
        raise f.error("delay_ms", "one_way_delay_ms (renamed: the rtt fault sets each "
                      "direction's one-way delay; the RTT of 'wan' is twice it)", f.raw("delay_ms"))
    return {"one_way_delay_ms": f.num("one_way_delay_ms", lo=0, hi=10_000, unit="ms"),
            "jitter_ms": f.num("jitter_ms", 0.0, lo=0, hi=10_000, unit="ms")}, duration_s


def actions(fault, ops):
    p = fault.params
    return set_link_actions(fault, ops, delay_ms=p["one_way_delay_ms"], jitter_ms=p["jitter_ms"])


def export(fault, nominal, instances, horizon_s, notes):
    p = fault.params
    if p["jitter_ms"] > 0:
        notes.append(f"fault {fault.index} (rtt): jitter {p['jitter_ms']:g} ms with netem's "
                     "default distribution")
    return Export(wan=wan_set(fault, nominal, {"delay_ms": p["one_way_delay_ms"],
                                               "jitter_ms": p["jitter_ms"]}))
