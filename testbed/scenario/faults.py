"""Fault timeline -> timed actions on the live network and roles.

Each fault kind's module (testbed/spec/faultkinds/) says which actions it
takes and when; this module gives them the live operations (``LiveOps``:
the network runtime, cross traffic, the role processes) and logs
``fault_start`` and, when the fault has an end, ``fault_end`` to the events
log (``testbed.types.FaultEvent``), so plots and the report mark them; the
network/role changes themselves log their own events. A fault that started
is always ended: when the workload finishes first, the runner runs its end
action at once (so cross traffic stops and the link is restored before the
run's last samples, and the log pairs every start).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from testbed.net import runtime
from testbed.net.crosstraffic import start_cross_traffic
from testbed.net.plan import select_channels
from testbed.spec.faultkinds import kind
from testbed.spec.faultkinds.base import Action, FaultSpec
from testbed.types import FaultEvent

__all__ = ["Action", "LiveOps", "actions_for"]

_RESTORABLE = ("rate_gbit", "delay_ms", "jitter_ms", "loss", "duplicate_pct")


class LiveOps:
    """The operations a fault kind's actions call (testbed.spec.faultkinds.base.Ops).

    ``restore`` sets a field of each direction back to its value when these
    ops were made (each direction its own, so an asymmetric link stays so)."""

    def __init__(self, net, roles, link: str):
        self.net, self.roles = net, roles
        self._orig = {ch.id: {k: getattr(ch.spec, k) for k in _RESTORABLE}
                      for ch in select_channels(net.channels.values(), link)}

    def set_link(self, link: str, **changes):
        return runtime.set_link(self.net, link, **changes)

    def restore(self, link: str, *fields: str) -> None:
        for cid, values in self._orig.items():
            runtime.set_link(self.net, cid, **{k: values[k] for k in fields})

    def link_down(self, link: str):
        return runtime.link_down(self.net, link)

    def link_up(self, link: str):
        return runtime.link_up(self.net, link)

    def cross_traffic(self, flows: int, direction: str):
        return start_cross_traffic(self.net, flows, direction)

    def kill(self, role: str, instance: str | None):
        return self.roles.kill(role, instance)

    def restart(self, role: str, instance: str | None):
        return self.roles.restart(role, instance)


def _logged(net, fault: FaultSpec, edge: str, fn: Callable[[], object]) -> Callable[[], object]:
    def run():
        net.events.record(**FaultEvent(edge, fault.index, fault.kind, fault.link,
                                       _plain(fault.params)).record())
        return fn()
    return run


def _plain(params: dict) -> dict:
    return {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
            for k, v in params.items()}


def actions_for(fault: FaultSpec, net, roles) -> list[Action]:
    """The timed actions of one fault (``roles`` kills and restarts role processes)."""
    out = []
    for a in kind(fault.kind).actions(fault, LiveOps(net, roles, fault.link)):
        if a.starts is not None or a.ends is not None:
            edge = "start" if a.starts is not None else "end"
            a = dataclasses.replace(a, run=_logged(net, fault, edge, a.run))
        out.append(a)
    return out
