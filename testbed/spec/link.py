"""Link impairment specs: rate, delay, jitter, loss, reorder, queue limit.

Owns LinkSpec and LossSpec (frozen) and their parsing from a YAML mapping.
Units are in the field names; delay_ms is one way. Parsing is pure: it
checks values, never touches the kernel.

Example YAML::

    link: {rate_gbit: 10, delay_ms: 10, jitter_ms: 1, jitter_distribution: normal,
           loss: {model: gilbert_elliott, p_pct: 1, r_pct: 25}, reorder_pct: 0}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from testbed.spec.reader import Fields

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

    def replace(self, **changes) -> "LinkSpec":
        return dataclasses.replace(self, **changes)


_PCT = dict(lo=0.0, hi=100.0, unit="percent")


def parse_loss(f: Fields) -> LossSpec:
    model = f.choice("model", LOSS_MODELS, "random")
    if model == "random":
        spec = LossSpec(model, pct=f.num("pct", **_PCT))
    else:
        spec = LossSpec(
            model,
            p_pct=f.num("p_pct", **_PCT),
            r_pct=f.num("r_pct", 100.0, **_PCT),
            bad_loss_pct=f.num("bad_loss_pct", 100.0, **_PCT),
            good_loss_pct=f.num("good_loss_pct", 0.0, **_PCT),
        )
        if spec.r_pct == 0 and spec.p_pct > 0:
            raise f.error("r_pct", "> 0 when p_pct > 0 (else the link stays bad forever)", 0)
    f.done()
    return spec


def parse_link(f: Fields, base: LinkSpec | None = None) -> LinkSpec:
    """Parse a link mapping; fields not given come from ``base`` (or defaults)."""
    b = base or LinkSpec(rate_gbit=f.num("rate_gbit", lo=0, lo_open=True,
                                          hi=MAX_RATE_GBIT, unit="Gbit/s"))
    rate = f.num("rate_gbit", b.rate_gbit, lo=0, lo_open=True, hi=MAX_RATE_GBIT, unit="Gbit/s")
    delay = f.num("delay_ms", b.delay_ms, lo=0, hi=MAX_DELAY_MS, unit="ms")
    jitter = f.num("jitter_ms", b.jitter_ms, lo=0, hi=MAX_DELAY_MS, unit="ms")
    dist = f.choice("jitter_distribution", JITTER_DISTRIBUTIONS, b.jitter_distribution)
    if f.has("loss") and f.has("loss_pct"):
        raise f.error("loss_pct", "either loss_pct or loss, not both", f.raw("loss_pct"))
    if f.has("loss_pct"):
        loss = LossSpec("random", pct=f.num("loss_pct", **_PCT))
    elif f.has("loss"):
        loss = parse_loss(f.sub("loss"))
    else:
        loss = b.loss
    reorder = f.num("reorder_pct", b.reorder_pct, **_PCT)
    if reorder > 0 and delay == 0:
        raise f.error("reorder_pct", "0 when delay_ms is 0 (reordering needs a delay)", reorder)
    limit = f.int("queue_limit_pkts", b.queue_limit_pkts, lo=1)
    f.done()
    return LinkSpec(rate, delay, jitter, dist, loss, reorder, limit)
