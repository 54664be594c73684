"""A scenario's fault timeline as Chaos Mesh steps: one pure function, ``translate``.

Owns the meaning of every fault kind on a cluster, in plain data that
``testbed.export.chaos`` turns into a Workflow:

- the WAN's shape over time, ``WanSegment``s that tile [0, horizon): the
  nominal link, changed by ``bandwidth``, ``bandwidth_schedule``, ``rtt`` and
  ``loss`` (each sets both directions; a fault with a duration restores
  each direction's nominal value when it ends, as the single-machine runner
  does). Chaos Mesh cannot stack two NetworkChaos on the same pods (the
  later one wins, chaos-mesh#3631), so the shape is one NetworkChaos at a
  time, replaced at every change, never one per fault;
- ``Step``s beside it: ``link_flap`` -> a partition for ``down_s``;
  ``kill`` -> the instance's pod failed until the horizon (its Deployment
  would restart a deleted pod, which is not a kill); ``restart`` -> the pod
  failed for ``down_s`` then started again, same pod, empty caches;
  ``congestion`` -> an iperf3 client started for ``duration_s``.

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
from testbed.spec.faults import FaultSpec
from testbed.spec.link import LinkSpec, LossSpec
from testbed.spec.topology import WanSpec


@dataclass(frozen=True)
class Direction:
    """One direction of the WAN at one time (nominal values, k = 1)."""

    rate_gbit: float
    delay_ms: float
    jitter_ms: float
    loss_pct: float


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
class Step:
    """A timed action besides the WAN shape. kind: ``partition`` (target ``wan``),
    ``pod-failure`` (target: an instance name), ``cross-traffic`` (target
    ``a>b``/``b>a``, ``flows`` TCP streams)."""

    at_s: float
    duration_s: float
    kind: str
    target: str
    fault_index: int
    flows: int = 0


@dataclass(frozen=True)
class Timeline:
    horizon_s: float
    wan: tuple[WanSegment, ...]
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()


_WAN_KINDS = ("bandwidth", "bandwidth_schedule", "rtt", "loss")
MIN_SEGMENT_S = 0.001


def _direction(link: LinkSpec, notes: list[str], what: str) -> Direction:
    return Direction(link.rate_gbit, link.delay_ms, link.jitter_ms,
                     _loss_pct(link.loss, notes, what))


def _loss_pct(loss: LossSpec, notes: list[str], what: str) -> float:
    if loss.model == "gilbert_elliott":
        notes.append(f"{what}: Gilbert-Elliott loss (p {loss.p_pct:g}%, r {loss.r_pct:g}%, "
                     f"bad {loss.bad_loss_pct:g}%, good {loss.good_loss_pct:g}%) exported as "
                     f"random loss at its mean, {loss.mean_pct:.3g}%: NetworkChaos has only "
                     "random loss with a correlation")
    return loss.mean_pct


def _link_notes(link: LinkSpec, notes: list[str], what: str) -> None:
    if link.jitter_ms > 0:
        notes.append(f"{what}: jitter {link.jitter_ms:g} ms with netem's default "
                     f"distribution: NetworkChaos cannot set {link.jitter_distribution!r}")
    if link.reorder_pct > 0:
        notes.append(f"{what}: reorder {link.reorder_pct:g}% not exported")
    if link.queue_limit_pkts is not None:
        notes.append(f"{what}: queue_limit_pkts {link.queue_limit_pkts} not exported "
                     "(NetworkChaos sets no netem limit)")


def _wan_changes(f: FaultSpec, nominal: tuple[Direction, Direction], notes: list[str]):
    """(t_s, fault index, order, {field: value or per-direction tuple}) of one fault."""
    p, what = f.params, f"fault {f.index} ({f.kind})"
    back = lambda field: tuple(getattr(d, field) for d in nominal)  # noqa: E731
    if f.kind == "bandwidth":
        out = [(f.at_s, f.index, 0, {"rate_gbit": p["rate_gbit"]})]
        ends = {"rate_gbit": back("rate_gbit")}
    elif f.kind == "bandwidth_schedule":
        return [(f.at_s + off, f.index, i, {"rate_gbit": rate})
                for i, (off, rate) in enumerate(p["schedule"])]
    elif f.kind == "rtt":
        out = [(f.at_s, f.index, 0, {"delay_ms": p["one_way_delay_ms"], "jitter_ms": p["jitter_ms"]})]
        ends = {"delay_ms": back("delay_ms"), "jitter_ms": back("jitter_ms")}
        if p["jitter_ms"] > 0:
            notes.append(f"{what}: jitter {p['jitter_ms']:g} ms with netem's default "
                         "distribution")
    else:
        out = [(f.at_s, f.index, 0, {"loss_pct": _loss_pct(p["loss"], notes, what)})]
        ends = {"loss_pct": back("loss_pct")}
    if f.end_s is not None:
        out.append((f.end_s, f.index, 1_000_000, ends))
    return out


def _apply(state: tuple[Direction, Direction], change: dict) -> tuple[Direction, Direction]:
    out = []
    for i, d in enumerate(state):
        fields = {k: (v[i] if isinstance(v, tuple) else v) for k, v in change.items()}
        out.append(replace(d, **fields))
    return out[0], out[1]


def _segments(changes: list, nominal: tuple[Direction, Direction],
              horizon_s: float) -> tuple[WanSegment, ...]:
    """Piecewise-constant WAN states over [0, horizon). A state that would last less
    than MIN_SEGMENT_S (a Workflow deadline has millisecond steps) is skipped: the
    next one starts where it would have."""
    state, start, segs = nominal, 0.0, []
    for t, _, _, change in sorted(changes, key=lambda c: c[:3]):
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


def _step(f: FaultSpec, instances: dict[str, list[str]], horizon_s: float) -> Step | None:
    p = f.params
    if f.kind == "link_flap":
        kind, target = "partition", "wan"
    elif f.kind == "congestion":
        kind, target = "cross-traffic", p["direction"]
    else:
        names = instances.get(p["role"], [])
        if p["instance"] is not None and p["instance"] not in names:
            raise PlanError(f"fault {f.index} ({f.kind}): no {p['role']} instance "
                            f"{p['instance']!r} (instances: {', '.join(names) or 'none'})")
        if not names:
            raise PlanError(f"fault {f.index} ({f.kind}): this mode has no {p['role']} instance")
        kind, target = "pod-failure", p["instance"] or names[0]
    end = horizon_s if f.kind == "kill" else min(f.end_s, horizon_s)
    return Step(f.at_s, end - f.at_s, kind, target, f.index, p.get("flows", 0))


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
    changes, steps = [], []
    for f in faults:
        if f.link != "wan":
            raise PlanError(f"fault {f.index} ({f.kind}): link {f.link!r}: only the WAN "
                            "('wan') can be exported to Chaos Mesh")
        if f.at_s >= horizon_s:
            notes.append(f"fault {f.index} ({f.kind}) at {f.at_s:g} s: after the run's end "
                         f"({horizon_s:g} s), dropped")
            continue
        if f.kind in _WAN_KINDS:
            changes += _wan_changes(f, nominal, notes)
            continue
        step = _step(f, instances, horizon_s)
        if step.duration_s < MIN_SEGMENT_S:
            notes.append(f"fault {f.index} ({f.kind}) lasts {step.duration_s:g} s within the "
                         f"run, under a Workflow deadline's {MIN_SEGMENT_S:g} s step: dropped")
            continue
        steps.append(step)
    steps.sort(key=lambda s: (s.at_s, s.fault_index))
    return Timeline(horizon_s, _segments(changes, nominal, horizon_s), tuple(steps),
                    tuple(dict.fromkeys(notes)))
