"""What every fault kind module shares: the parsed fault, the runner's timed
action, the operations a kind may ask of the live network and roles, and
the plain data a kind hands the Chaos Mesh export.

A fault kind is one module in this package (see ``__init__``'s registry)
with five names:

- ``NAME``: the ``kind:`` value in a scenario;
- ``DOC``: its line in the scenario reference (parameters, meaning);
- ``parse(f, base, duration_s)``: its parameters from the YAML mapping
  (``testbed.reader.Fields``), returned as ``(params, duration_s)``; the
  fields every fault has (``at_s``, ``kind``, ``link``, ``duration_s``) are
  read before;
- ``actions(fault, ops)``: the runner's timed actions (``Action``), built
  with ``start``/``end``/``at``; ``ops`` (``Ops``) is how they change the
  network and the roles, so this package stays pure;
- ``export(fault, wan, instances, horizon_s, notes)``: its cluster
  translation (``Export``: changes of the WAN's netem shape and/or one
  ``Step`` run beside it: a partition, a pod failure, cross traffic).

Pure: nothing here touches the kernel or a process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from testbed.errors import PlanError
from testbed.spec.triggers import Trigger


@dataclass(frozen=True)
class FaultSpec:
    """One fault. ``at_s``: seconds from the workload start, or, for a fault with
    ``trigger`` (a ``Trigger``), seconds after the event it fires on (its ``delay_s``)."""

    index: int
    at_s: float
    kind: str
    link: str = "wan"
    duration_s: float | None = None
    params: dict = field(default_factory=dict)  # the kind's own, plain data
    trigger: Trigger | None = None  # starts on a protocol event, not at a time

    @property
    def end_s(self) -> float | None:
        return None if self.duration_s is None else self.at_s + self.duration_s


@dataclass(frozen=True)
class Action:
    """One timed action of the runner: seconds from the workload start, a label,
    what to run. ``starts``/``ends``: the index of the fault this action starts or
    ends (an end runs even when the workload finished first)."""

    at_s: float
    label: str
    run: Callable[[], object]
    starts: int | None = None
    ends: int | None = None


def start(fault: FaultSpec, fn: Callable[[], object]) -> Action:
    return Action(fault.at_s, f"{fault.kind} start", fn, starts=fault.index)


def end(fault: FaultSpec, fn: Callable[[], object]) -> Action:
    if fault.end_s is None:
        raise PlanError(f"fault {fault.index} ({fault.kind}): an end without a duration")
    return Action(fault.end_s, f"{fault.kind} end", fn, ends=fault.index)


def at(t_s: float, label: str, fn: Callable[[], object]) -> Action:
    return Action(t_s, label, fn)


def set_link_actions(fault: FaultSpec, ops: "Ops", **values) -> list[Action]:
    """A link change: ``values`` at the fault's start; at its end (when it has one)
    each of those fields back to what it was."""
    out = [start(fault, lambda: ops.set_link(fault.link, **values))]
    if fault.end_s is not None:
        out.append(end(fault, lambda: ops.restore(fault.link, *values)))
    return out


class CrossTraffic(Protocol):
    def stop(self) -> object: ...


class Ops(Protocol):
    """What a fault's actions may do to the live run (testbed.scenario.faults)."""

    def set_link(self, link: str, **changes) -> object:
        """Change a link's nominal values (rate_gbit, delay_ms, jitter_ms, loss,
        duplicate_pct) on each selected direction."""

    def restore(self, link: str, *fields: str) -> object:
        """Set ``fields`` of each direction of ``link`` back to what they were when
        the fault's actions were made (an asymmetric link stays so)."""

    def link_down(self, link: str) -> object: ...

    def link_up(self, link: str) -> object: ...

    def cross_traffic(self, flows: int, direction: str) -> CrossTraffic: ...

    def kill(self, role: str, instance: str | None) -> object: ...

    def restart(self, role: str, instance: str | None) -> object: ...


@dataclass(frozen=True)
class WanChange:
    """A change of the WAN's netem shape at ``t_s``: ``values`` maps a field of
    ``testbed.export.timeline.Direction`` to one value (both directions) or a
    (a>b, b>a) pair. ``order`` sorts changes at the same time within a fault."""

    t_s: float
    fault: int
    order: int
    values: dict


@dataclass(frozen=True)
class Step:
    """A timed cluster action beside the WAN shape. ``action``: the Chaos Mesh
    action (``partition``, target ``wan``; ``pod-failure``, target an instance
    name; ``cross-traffic``, target ``a>b``/``b>a`` with ``flows`` TCP streams)."""

    at_s: float
    duration_s: float
    action: str
    target: str
    fault_index: int
    fault_kind: str
    flows: int = 0


@dataclass(frozen=True)
class Export:
    wan: tuple[WanChange, ...] = ()
    step: Step | None = None


@dataclass(frozen=True)
class Nominal:
    """The WAN's nominal value of each exported field, per direction (a>b, b>a)."""

    values: dict  # field -> (a>b, b>a)

    def __getitem__(self, name: str) -> tuple:
        return self.values[name]


def wan_set(fault: FaultSpec, nominal: Nominal, values: dict) -> tuple[WanChange, ...]:
    """``values`` from the fault's start; each field's nominal value back at its end
    (when it has one), as the single-machine runner restores it."""
    out = [WanChange(fault.at_s, fault.index, 0, dict(values))]
    if fault.end_s is not None:
        out.append(WanChange(fault.end_s, fault.index, 1_000_000,
                             {k: nominal[k] for k in values}))
    return tuple(out)
