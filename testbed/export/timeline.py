"""A scenario's fault timeline as Chaos Mesh steps: one pure function, ``translate``.

Owns the meaning of every fault kind on a cluster, in plain data that
``testbed.export.chaos`` turns into a Workflow:

- the WAN's shape over time, ``WanSegment``s that tile [0, horizon): the
  nominal link, changed by the WAN kinds (``bandwidth``,
  ``bandwidth_schedule``, ``rtt``, ``loss``, ``duplicate``: each sets both
  directions; a fault with a duration restores each direction's nominal
  value when it ends, as the single-machine runner does). Chaos Mesh
  cannot stack two NetworkChaos on the same pods (the later one wins,
  chaos-mesh#3631), so the shape is one NetworkChaos at a time, replaced
  at every change, never one per fault;
- ``Step``s beside it (a partition, a pod failure, cross traffic).

Each fault kind's module (testbed/spec/faultkinds/) says what it is on a
cluster (its ``export``): changes of the WAN's shape, a step, or both; this
module joins them into one timeline.

Times are seconds from the workload start (the client's ``ready``), as in
the scenario. Actions at the same time keep the single-machine order: by
fault, a fault's start before its end. What happens at or after
``horizon_s`` (the runner's deadline: last arrival + drain + request
timeout) never runs there either and is dropped; what lasts beyond it is
cut at it. Every approximation is returned in ``notes``.

Example::

    tl = translate(sc.faults, sc.topology.wan, {"main_decode": ["md1"]}, 200.0)
    [(s.start_s, s.a_to_b.rate_gbit) for s in tl.wan]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from testbed.errors import PlanError
from testbed.spec.faultkinds import kind
from testbed.spec.faultkinds.base import FaultSpec, Nominal, Step, WanChange
from testbed.spec.faultkinds.loss import exported_loss_pct
from testbed.impairment import LinkSpec
from testbed.spec.topology import WanSpec

__all__ = ["Direction", "MIN_SEGMENT_S", "Step", "Timeline", "WanSegment", "translate"]


@dataclass(frozen=True)
class Direction:
    """One direction of the WAN at one time (nominal values, k = 1)."""

    rate_gbit: float
    delay_ms: float
    jitter_ms: float
    loss_pct: float
    duplicate_pct: float = 0.0


@dataclass(frozen=True)
class WanSegment:
    start_s: float
    end_s: float
    a_to_b: Direction
    b_to_a: Direction

    @property
    def symmetric(self) -> bool:
        return self.a_to_b == self.b_to_a


@dataclass(frozen=True)
class Timeline:
    horizon_s: float
    wan: tuple[WanSegment, ...]
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()


MIN_SEGMENT_S = 0.001


def _direction(link: LinkSpec, notes: list[str], what: str) -> Direction:
    return Direction(link.rate_gbit, link.delay_ms, link.jitter_ms,
                     exported_loss_pct(link.loss, notes, what), link.duplicate_pct)


def _link_notes(link: LinkSpec, notes: list[str], what: str) -> None:
    if link.jitter_ms > 0:
        notes.append(f"{what}: jitter {link.jitter_ms:g} ms with netem's default "
                     f"distribution: NetworkChaos cannot set {link.jitter_distribution!r}")
    if link.reorder_pct > 0:
        notes.append(f"{what}: reorder {link.reorder_pct:g}% not exported")
    if link.queue_limit_pkts is not None:
        notes.append(f"{what}: queue_limit_pkts {link.queue_limit_pkts} not exported "
                     "(NetworkChaos sets no netem limit)")


def _apply(state: tuple[Direction, Direction], change: dict) -> tuple[Direction, Direction]:
    out = []
    for i, d in enumerate(state):
        fields = {k: (v[i] if isinstance(v, tuple) else v) for k, v in change.items()}
        out.append(replace(d, **fields))
    return out[0], out[1]


def _segments(changes: list[WanChange], nominal: tuple[Direction, Direction],
              horizon_s: float) -> tuple[WanSegment, ...]:
    """Piecewise-constant WAN states over [0, horizon). A state that would last less
    than MIN_SEGMENT_S (a Workflow deadline has millisecond steps) is skipped: the
    next one starts where it would have."""
    state, start, segs = nominal, 0.0, []
    for c in sorted(changes, key=lambda c: (c.t_s, c.fault, c.order)):
        t, change = c.t_s, c.values
        if t > horizon_s - MIN_SEGMENT_S:
            break
        new = _apply(state, change)
        if new == state:
            continue
        if t - start >= MIN_SEGMENT_S:
            _push(segs, WanSegment(start, t, *state))
            start = t
        state = new
    _push(segs, WanSegment(start, horizon_s, *state))
    return tuple(segs)


def _push(segs: list[WanSegment], seg: WanSegment) -> None:
    """Append ``seg``, or extend the last segment if it has the same state (a skipped
    state between two equal ones)."""
    last = segs[-1] if segs else None
    if last is not None and (last.a_to_b, last.b_to_a) == (seg.a_to_b, seg.b_to_a):
        segs[-1] = replace(last, end_s=seg.end_s)
    else:
        segs.append(seg)


def translate(faults: tuple[FaultSpec, ...], wan: WanSpec, instances: dict[str, list[str]],
              horizon_s: float) -> Timeline:
    """The Chaos Mesh timeline of ``faults`` (see the module docstring).

    ``instances`` maps a role (``main_decode``...) to its instance names in
    config order; the first is the one a fault without ``instance`` hits.
    """
    if horizon_s <= 0:
        raise PlanError(f"timeline horizon {horizon_s!r} s: expected > 0")
    notes: list[str] = []
    for what, link in (("WAN a>b", wan.a_to_b), ("WAN b>a", wan.b_to_a)):
        _link_notes(link, notes, what)
    nominal = (_direction(wan.a_to_b, notes, "WAN a>b"), _direction(wan.b_to_a, notes, "WAN b>a"))
    per_field = {f: (getattr(nominal[0], f), getattr(nominal[1], f))
                 for f in Direction.__dataclass_fields__}
    changes: list[WanChange] = []
    steps: list[Step] = []
    for f in faults:
        if f.link != "wan":
            raise PlanError(f"fault {f.index} ({f.kind}): link {f.link!r}: only the WAN "
                            "('wan') can be exported to Chaos Mesh")
        if f.trigger is not None:
            raise PlanError(f"fault {f.index} ({f.kind}) starts {f.trigger.describe()}: a protocol "
                            "event of the roles has no Chaos Mesh translation (a Workflow "
                            "runs on a schedule); give it an at_s to export it")
        if f.at_s >= horizon_s:
            notes.append(f"fault {f.index} ({f.kind}) at {f.at_s:g} s: after the run's end "
                         f"({horizon_s:g} s), dropped")
            continue
        part = kind(f.kind).export(f, Nominal(per_field), instances, horizon_s, notes)
        changes += part.wan
        step = part.step
        if step is None:
            continue
        if step.duration_s < MIN_SEGMENT_S:
            notes.append(f"fault {f.index} ({f.kind}) lasts {step.duration_s:g} s within the "
                         f"run, under a Workflow deadline's {MIN_SEGMENT_S:g} s step: dropped")
            continue
        steps.append(step)
    steps.sort(key=lambda s: (s.at_s, s.fault_index))
    return Timeline(horizon_s, _segments(changes, nominal, horizon_s), tuple(steps),
                    tuple(dict.fromkeys(notes)))
