"""A link's impairments as one validated type: rate, delay, jitter, loss, reorder, duplication.

Owns ``LinkSpec`` and ``LossSpec`` (frozen, validated in their constructors,
so a scenario ``wan:`` override, a CLI flag, a fault or a test's fake WAN
cannot build an invalid one), ``check_delay_stage`` (the rules every
delay/loss stage obeys), the one list of jitter distributions and loss
models (the netem encoder, the userspace delay line and the roles' fake WAN
take theirs from here) and the bounds (``MAX_RATE_GBIT``, ``MAX_DELAY_MS``).
Units are in the field names; delay_ms is one way, percentages are 0-100.
An invalid value raises ``SpecError`` naming the field. Reading one from
YAML is testbed/spec/link.py's. Pure: it checks values, never touches the
kernel; imports only testbed.errors.

Example::

    LinkSpec(rate_gbit=10, delay_ms=10, jitter_ms=1, jitter_distribution="normal",
             loss=LossSpec("gilbert_elliott", p_pct=1, r_pct=25))
    LinkSpec(rate_gbit=10, reorder_pct=5)  # SpecError: reorder_pct, reordering needs a delay
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from testbed.errors import SpecError

# The one list of each: spec, netem encoder (net/netem.py), delay line
# (net/impairments.py) and the roles' fake WAN (pdd/wire/fake_wan.py) all read these.
JITTER_DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")
LOSS_MODELS = ("random", "gilbert_elliott")
MAX_RATE_GBIT = 1000.0
MAX_DELAY_MS = 10_000.0


@dataclass(frozen=True)
class LossSpec:
    """Packet loss on one direction of a link.

    model 'random': each packet lost with pct percent.
    model 'gilbert_elliott' (netem's gemodel): p_pct good->bad transition,
    r_pct bad->good, bad_loss_pct (1-h) loss in the bad state, good_loss_pct
    (1-k) loss in the good state.
    """

    model: str = "random"
    pct: float = 0.0
    p_pct: float = 0.0
    r_pct: float = 100.0
    bad_loss_pct: float = 100.0
    good_loss_pct: float = 0.0

    def __post_init__(self) -> None:
        _check_choice("loss.model", self.model, LOSS_MODELS)
        for name in ("pct", "p_pct", "r_pct", "bad_loss_pct", "good_loss_pct"):
            _check_number(f"loss.{name}", getattr(self, name), 0.0, 100.0)
        if self.model == "random" and self.p_pct > 0:
            raise SpecError(_WHAT, "loss.p_pct", "0 with model 'random'", self.p_pct)
        if self.model == "gilbert_elliott" and self.pct > 0:
            raise SpecError(_WHAT, "loss.pct", "0 with model 'gilbert_elliott' (use p_pct...)",
                            self.pct)
        if self.model == "gilbert_elliott" and self.r_pct == 0 and self.p_pct > 0:
            raise SpecError(_WHAT, "loss.r_pct",
                            "> 0 when p_pct > 0 (else the link stays bad forever)", 0)

    @property
    def mean_pct(self) -> float:
        """Long-run loss percentage (stationary for Gilbert-Elliott)."""
        if self.model == "random":
            return self.pct
        p, r = self.p_pct / 100, self.r_pct / 100
        if p + r == 0:
            return self.good_loss_pct
        bad_share = p / (p + r)
        return bad_share * self.bad_loss_pct + (1 - bad_share) * self.good_loss_pct

    @property
    def active(self) -> bool:
        return self.mean_pct > 0


_WHAT = "link"  # SpecError's "file" for a value built in code (CLI flag, override, fault)


def _check_number(name: str, value: object, lo: float, hi: float, lo_open: bool = False) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (lo < value if lo_open else lo <= value) and value <= hi)
    if not ok:
        raise SpecError(_WHAT, name, f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}]",
                        value)


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(_WHAT, name, f"one of {', '.join(allowed)}", value)


def check_delay_stage(delay_ms: object, jitter_ms: object, distribution: object,
                      loss: object, reorder_pct: object, duplicate_pct: object = 0.0) -> None:
    """The rules every delay/loss stage obeys (LinkSpec and the plan's Impairment)."""
    _check_number("delay_ms", delay_ms, 0.0, MAX_DELAY_MS)
    _check_number("jitter_ms", jitter_ms, 0.0, MAX_DELAY_MS)
    _check_choice("jitter_distribution", distribution, JITTER_DISTRIBUTIONS)
    if not isinstance(loss, LossSpec):
        raise SpecError(_WHAT, "loss", "a LossSpec", loss)
    _check_number("reorder_pct", reorder_pct, 0.0, 100.0)
    if reorder_pct > 0 and delay_ms == 0:
        raise SpecError(_WHAT, "reorder_pct", "0 when delay_ms is 0 (reordering needs a delay)",
                        reorder_pct)
    _check_number("duplicate_pct", duplicate_pct, 0.0, 100.0)


NO_LOSS = LossSpec()


@dataclass(frozen=True)
class LinkSpec:
    """One direction of a link as the topology describes it (nominal values)."""

    rate_gbit: float
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    jitter_distribution: str = "normal"
    loss: LossSpec = NO_LOSS
    reorder_pct: float = 0.0
    queue_limit_pkts: int | None = None  # None: sized from the BDP by the planner
    duplicate_pct: float = 0.0  # share of packets sent twice (netem's duplicate)

    def __post_init__(self) -> None:
        _check_number("rate_gbit", self.rate_gbit, 0.0, MAX_RATE_GBIT, lo_open=True)
        check_delay_stage(self.delay_ms, self.jitter_ms, self.jitter_distribution, self.loss,
                          self.reorder_pct, self.duplicate_pct)
        q = self.queue_limit_pkts
        if q is not None and (not isinstance(q, int) or isinstance(q, bool) or q < 1):
            raise SpecError(_WHAT, "queue_limit_pkts", "an integer >= 1 or none", q)

    def replace(self, **changes) -> "LinkSpec":
        """A copy with ``changes``; validated like any LinkSpec (SpecError)."""
        return dataclasses.replace(self, **changes)
