"""Fault timeline specs: what happens to the network or the roles, and when.

Owns the parsing of a scenario's ``faults:`` list into ``FaultSpec``s. Each
entry has ``at_s`` (seconds from the workload start), a ``kind``, an
optional ``link`` (default ``wan``) and ``duration_s``, and that kind's
parameters, which the kind's own module reads (testbed/spec/faultkinds/:
one module per kind, its parameters, runner actions and Chaos Mesh
translation). A duration makes a fault end by itself. Instead of ``at_s`` a
fault may have ``trigger: {event, nth, role|instance, delay_s}``: it starts on a
role's protocol event (testbed/spec/triggers.py), its times counted from
there. Pure: the runner's ``testbed.scenario.faults`` turns the specs into
timed actions.

Kinds (``testbed.spec.faultkinds.reference()``)::

    bandwidth    rate_gbit [link] [duration_s]             one step
    bandwidth_schedule  steps | ramp | trace FILE          a rate schedule from at_s on
    congestion   flows [direction a>b|b>a] duration_s      N TCP cross flows
    duplicate    pct [link] [duration_s]                   packets sent twice
    kill         role [instance]                           kill -9 a role process
    link_flap    down_s [link]                             link down, then up
    loss         pct | loss: {model: gilbert_elliott, ...} [link] [duration_s]
    restart      role [instance] down_s                    kill -9, start again after down_s
    rtt          one_way_delay_ms [jitter_ms] [link] [duration_s]
"""

from __future__ import annotations

from pathlib import Path

from testbed.reader import Fields
from testbed.spec.faultkinds import FAULT_KINDS, kind
from testbed.spec.faultkinds.base import FaultSpec
from testbed.spec.faultkinds.bandwidth_schedule import load_rate_trace
from testbed.spec.faultkinds.kill import KILLABLE_ROLES
from testbed.spec.triggers import parse_trigger

__all__ = ["FAULT_KINDS", "KILLABLE_ROLES", "FaultSpec", "load_rate_trace", "parse_faults"]


def _parse_one(f: Fields, index: int, base: Path) -> FaultSpec:
    trigger = None
    if f.has("trigger"):
        if f.has("at_s"):
            raise f.error("at_s", "absent when trigger: is given (a fault starts at a time or "
                          "on an event)", f.raw("at_s"))
        trigger = parse_trigger(f.sub("trigger"))
        at = trigger.delay_s
    else:
        at = f.num("at_s", lo=0, unit="s")
    name = f.choice("kind", FAULT_KINDS)
    link = f.str("link", "wan")
    duration = f.num("duration_s", None, lo=0, lo_open=True, unit="s")
    params, duration = kind(name).parse(f, base, duration)
    f.done()
    return FaultSpec(index, at, name, link, duration, params, trigger)


def parse_faults(f: Fields, key: str, base: Path) -> tuple[FaultSpec, ...]:
    if not f.has(key):
        f.raw(key, None)
        return ()
    return tuple(_parse_one(item, i, base) for i, item in enumerate(f.items(key)))
