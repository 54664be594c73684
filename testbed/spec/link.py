"""Link impairment specs read from YAML: rate, delay, jitter, loss, reorder, duplication, queue limit.

Owns ``parse_link`` and ``parse_loss``: a YAML mapping -> ``LinkSpec`` /
``LossSpec``, naming the YAML field of any value the types refuse. The
types themselves, their rules and the lists of jitter distributions and
loss models are testbed/impairment.py's (import them from there). Units are in the
field names; delay_ms is one way. Pure: it checks values, never touches the
kernel.

Example YAML::

    link: {rate_gbit: 10, delay_ms: 10, jitter_ms: 1, jitter_distribution: normal,
           loss: {model: gilbert_elliott, p_pct: 1, r_pct: 25}, reorder_pct: 0,
           duplicate_pct: 0}
"""

from __future__ import annotations

from testbed.errors import SpecError
from testbed.impairment import (JITTER_DISTRIBUTIONS, LOSS_MODELS, MAX_DELAY_MS, MAX_RATE_GBIT,
                                LinkSpec, LossSpec)
from testbed.reader import Fields

__all__ = ["parse_link", "parse_loss"]

_PCT = dict(lo=0.0, hi=100.0, unit="percent")


def parse_loss(f: Fields) -> LossSpec:
    model = f.choice("model", LOSS_MODELS, "random")
    if model == "random":
        values = dict(pct=f.num("pct", **_PCT))
    else:
        values = dict(p_pct=f.num("p_pct", **_PCT), r_pct=f.num("r_pct", 100.0, **_PCT),
                      bad_loss_pct=f.num("bad_loss_pct", 100.0, **_PCT),
                      good_loss_pct=f.num("good_loss_pct", 0.0, **_PCT))
    f.done()
    try:
        return LossSpec(model, **values)
    except SpecError as e:  # name the YAML field
        raise f.error(e.path.removeprefix("loss."), e.expected, e.got) from None


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
    limit = f.int("queue_limit_pkts", b.queue_limit_pkts, lo=1)
    duplicate = f.num("duplicate_pct", b.duplicate_pct, **_PCT)
    f.done()
    try:
        return LinkSpec(rate, delay, jitter, dist, loss, reorder, limit, duplicate)
    except SpecError as e:  # a rule across fields (LinkSpec's): name the YAML field
        raise f.error(e.path, e.expected, e.got) from None
