"""Fault timeline -> timed actions on the live network and roles.

Owns the translation of FaultSpecs into ``Action``s (time from workload
start, a callable, a label). An action may return further actions (none do
yet beyond the ones planned here). Every fault logs ``fault_start`` and,
when it has an end, ``fault_end`` to the events log, so plots can mark
them; the network/role changes themselves log their own events. A fault
that started is always ended: when the workload finishes first, the runner
runs its end action at once (so cross traffic stops and the link is
restored before the run's last samples, and the log pairs every start).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from testbed.net import runtime
from testbed.net.crosstraffic import start_cross_traffic
from testbed.net.plan import select_channels
from testbed.spec.faults import FaultSpec


@dataclass(frozen=True)
class Action:
    at_s: float
    label: str
    run: Callable[[], object]
    starts: int | None = None  # the index of the fault this action starts
    ends: int | None = None  # ... or ends: run even when the workload finished first


def _logged(net, fault: FaultSpec, edge: str, fn: Callable[[], object]) -> Callable[[], object]:
    def run():
        net.events.record(f"fault_{edge}", fault=fault.index, fault_kind=fault.kind,
                          link=fault.link, **_plain(fault.params))
        return fn()
    return run


def _plain(params: dict) -> dict:
    out = {}
    for k, v in params.items():
        out[k] = v.__dict__ if hasattr(v, "__dict__") else v
    return out


def _original(net, link: str) -> dict[str, dict]:
    """Each channel of ``link`` with its own values before the fault (a restore
    sets each direction back to its own, so an asymmetric link stays so)."""
    return {ch.id: {"rate_gbit": ch.spec.rate_gbit, "delay_ms": ch.spec.delay_ms,
                    "jitter_ms": ch.spec.jitter_ms, "loss": ch.spec.loss}
            for ch in select_channels(net.channels.values(), link)}


def _restore(net, orig: dict[str, dict], *fields: str) -> None:
    for cid, values in orig.items():
        runtime.set_link(net, cid, **{k: values[k] for k in fields})


def actions_for(fault: FaultSpec, net, roles) -> list[Action]:
    """The timed actions of one fault (``roles`` kills role processes)."""
    f, p, at = fault, fault.params, fault.at_s
    orig = _original(net, f.link)
    start = lambda fn: Action(at, f"{f.kind} start", _logged(net, f, "start", fn),  # noqa: E731
                              starts=f.index)
    end = lambda fn: Action(f.end_s, f"{f.kind} end", _logged(net, f, "end", fn),  # noqa: E731
                            ends=f.index)
    out: list[Action] = []
    if f.kind == "bandwidth":
        out.append(start(lambda: runtime.set_link(net, f.link, rate_gbit=p["rate_gbit"])))
        if f.end_s is not None:
            out.append(end(lambda: _restore(net, orig, "rate_gbit")))
    elif f.kind == "bandwidth_schedule":
        out.append(start(lambda: None))
        for off, rate in p["schedule"]:
            out.append(Action(at + off, f"bandwidth {rate:g} Gbit/s",
                              lambda r=rate: runtime.set_link(net, f.link, rate_gbit=r)))
    elif f.kind == "rtt":
        out.append(start(lambda: runtime.set_link(net, f.link, delay_ms=p["one_way_delay_ms"],
                                                  jitter_ms=p["jitter_ms"])))
        if f.end_s is not None:
            out.append(end(lambda: _restore(net, orig, "delay_ms", "jitter_ms")))
    elif f.kind == "loss":
        out.append(start(lambda: runtime.set_link(net, f.link, loss=p["loss"])))
        if f.end_s is not None:
            out.append(end(lambda: _restore(net, orig, "loss")))
    elif f.kind == "link_flap":
        out.append(start(lambda: runtime.link_down(net, f.link)))
        out.append(end(lambda: runtime.link_up(net, f.link)))
    elif f.kind == "congestion":
        holder: dict = {}
        out.append(start(lambda: holder.setdefault(
            "flows", start_cross_traffic(net, p["flows"], p["direction"]))))
        out.append(end(lambda: holder["flows"].stop() if "flows" in holder else None))
    elif f.kind == "kill":
        out.append(start(lambda: roles.kill(p["role"], p["instance"])))
    elif f.kind == "restart":
        out.append(start(lambda: roles.kill(p["role"], p["instance"])))
        out.append(end(lambda: roles.restart(p["role"], p["instance"])))
    return out
