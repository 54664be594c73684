"""Prefix hit-rate distributions: the PDD paper's bins, custom histograms, a default shape.

Owns HitBin, HitRateSpec, PDD_BINS_PCT, ``parse_hit_rate``, ``skewed_bins``,
``sample_targets`` and the bin arithmetic shared by the generator and the
workload statistics (``bin_index``, ``histogram``). Hit rates are percent in
YAML and in bins, fractions (0..1) per request.

The PDD paper bins requests in 7 hit-rate ranges "from 0-90% up to 99-100%";
this module fixes them as (percent)::

    [0, 90) [90, 95) [95, 96) [96, 97) [97, 98) [98, 99) [99, 100]

so that "above 95%" is a bin edge. A bin is half-open [lo, hi) except that
hi = 100 includes 100; a bin with lo = hi is allowed only at 0 or 100 and
holds exactly that value (e.g. prompts that share nothing).

YAML forms (exactly one key)::

    hit_rate: {pdd_bins: [0.14, 0.12, 0.07, 0.09, 0.13, 0.19, 0.27]}   # 7 weights
    hit_rate: {bins: [{lo_pct: 0, hi_pct: 0, weight: 1}, {lo_pct: 95, hi_pct: 100, weight: 1}]}
    hit_rate: {mean_pct: 90}     # default skewed shape, see skewed_bins

Example::

    bins = skewed_bins(90.0)           # ~74% of requests above 95%
    idx, h = sample_targets(bins, np.random.default_rng(0), 1000)
    histogram(100 * h, bins)           # shares per bin, close to the weights
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from testbed.errors import SpecError
from testbed.reader import Fields, join

PDD_BINS_PCT: tuple[tuple[float, float], ...] = (
    (0, 90), (90, 95), (95, 96), (96, 97), (97, 98), (98, 99), (99, 100))
# Shape above 90% used by ``mean_pct``: 86.5% of it lies above 95%.
_HIGH_WEIGHTS = (0.0, 0.135, 0.08, 0.10, 0.15, 0.22, 0.315)
_LOW_WEIGHTS = (1.0, 0, 0, 0, 0, 0, 0)
_TOP_WEIGHTS = (0, 0, 0, 0, 0, 0, 1.0)
MEAN_PCT_RANGE = (45.0, 99.5)  # means the default shape can reach (mid of 0-90 .. of 99-100)


@dataclass(frozen=True)
class HitBin:
    lo_pct: float
    hi_pct: float
    weight: float  # share of requests, normalised so the bins sum to 1

    @property
    def mid_pct(self) -> float:
        return (self.lo_pct + self.hi_pct) / 2

    def contains(self, x_pct: float) -> bool:
        if self.lo_pct == self.hi_pct:
            return x_pct == self.lo_pct
        return self.lo_pct <= x_pct < self.hi_pct or x_pct == self.hi_pct == 100


@dataclass(frozen=True)
class HitRateSpec:
    """Target per-request hit-rate histogram; ``form`` says how the YAML gave it."""

    bins: tuple[HitBin, ...]
    form: str  # "pdd_bins", "bins" or "mean_pct"

    @property
    def mean_pct(self) -> float:
        """Designed per-request mean (hit rate uniform within each bin)."""
        return sum(b.weight * b.mid_pct for b in self.bins)


def _from_weights(weights: Iterable[float]) -> tuple[HitBin, ...]:
    weights = tuple(weights)
    total = float(sum(weights))
    return tuple(HitBin(lo, hi, w / total) for (lo, hi), w in zip(PDD_BINS_PCT, weights))


def skewed_bins(mean_pct: float) -> tuple[HitBin, ...]:
    """PDD bins with the default skewed shape and the given per-request mean.

    The shape above 90% is fixed (_HIGH_WEIGHTS, mean ~97.4%); a lower mean
    moves weight to the 0-90% tail, a higher one to 99-100%. At 90%: 14.1% of
    requests in 0-90%, 11.6% in 90-95%, 74.3% above 95% (the paper's 70-80%, docs/paper.md).
    Example: ``skewed_bins(90)[0].weight`` is ~0.141.
    """
    lo, hi = MEAN_PCT_RANGE
    if not lo <= mean_pct <= hi:
        raise ValueError(f"mean_pct must be in {lo}..{hi}, got {mean_pct}")
    high_mean = sum(w * (a + b) / 2 for w, (a, b) in zip(_HIGH_WEIGHTS, PDD_BINS_PCT))
    if mean_pct <= high_mean:
        t, other = (high_mean - mean_pct) / (high_mean - lo), _LOW_WEIGHTS
    else:
        t, other = (mean_pct - high_mean) / (hi - high_mean), _TOP_WEIGHTS
    return _from_weights((1 - t) * a + t * b for a, b in zip(_HIGH_WEIGHTS, other))


def _weight(file: str, where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e300:
        raise SpecError(file, where, "a weight >= 0", value)
    return float(value)


def _parse_bins(items: list[Fields]) -> tuple[HitBin, ...]:
    bins: list[HitBin] = []
    for bf in items:
        lo, hi = bf.num("lo_pct", lo=0, hi=100, unit="%"), bf.num("hi_pct", lo=0, hi=100, unit="%")
        if hi < lo or (hi == lo and lo not in (0, 100)):
            raise bf.error("hi_pct", f"a percent > lo_pct ({lo:g}); equal only at 0 or 100", hi)
        if bins and (lo < bins[-1].hi_pct or (lo == bins[-1].lo_pct == bins[-1].hi_pct == hi)):
            raise bf.error("lo_pct", f"bins in increasing order, not overlapping the previous "
                           f"one ({bins[-1].lo_pct:g}-{bins[-1].hi_pct:g}%)", lo)
        bins.append(HitBin(lo, hi, _weight(bf.file, bf.where("weight"), bf.raw("weight"))))
        bf.done()
    return bins


def parse_hit_rate(f: Fields) -> HitRateSpec:
    """Parse one of the three forms in the module docstring."""
    forms = [k for k in ("pdd_bins", "bins", "mean_pct") if f.has(k)]
    if len(forms) != 1:
        raise SpecError(f.file, f.path, "exactly one of pdd_bins, bins, mean_pct",
                        forms or sorted(f.data))
    form = forms[0]
    if form == "mean_pct":
        lo, hi = MEAN_PCT_RANGE
        bins = skewed_bins(f.num("mean_pct", lo=lo, hi=hi, unit="%"))
    elif form == "pdd_bins":
        raw = f.list("pdd_bins")
        if len(raw) != len(PDD_BINS_PCT):
            raise f.error("pdd_bins", f"{len(PDD_BINS_PCT)} weights, one per PDD bin "
                          + " ".join(f"{a:g}-{b:g}%" for a, b in PDD_BINS_PCT), raw)
        base = join(f.path, "pdd_bins")
        bins = tuple(HitBin(a, b, _weight(f.file, join(base, i), w)) for i, ((a, b), w)
                     in enumerate(zip(PDD_BINS_PCT, raw)))
    else:
        bins = tuple(_parse_bins(f.items("bins", min_len=1)))
    total = sum(b.weight for b in bins)
    if total <= 0:
        raise f.error(form, "weights with a positive sum", [b.weight for b in bins])
    f.done()
    return HitRateSpec(tuple(HitBin(b.lo_pct, b.hi_pct, b.weight / total) for b in bins), form)


def sample_targets(bins: tuple[HitBin, ...], rng: np.random.Generator,
                   n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per request: the bin index and a target hit fraction uniform within that bin."""
    idx = rng.choice(len(bins), size=n, p=np.asarray([b.weight for b in bins]))
    lo = np.asarray([b.lo_pct for b in bins])[idx]
    hi = np.asarray([b.hi_pct for b in bins])[idx]
    return idx, (lo + (hi - lo) * rng.random(n)) / 100.0


def bin_index(x_pct: float, bins: tuple[HitBin, ...]) -> int | None:
    """The bin holding ``x_pct`` (point bins first), or None if it falls in a gap."""
    for i, b in enumerate(bins):
        if b.lo_pct == b.hi_pct and b.contains(x_pct):
            return i
    for i, b in enumerate(bins):
        if b.contains(x_pct):
            return i
    return None


def histogram(x_pcts: Iterable[float], bins: tuple[HitBin, ...]) -> tuple[float, ...]:
    """Share of values in each bin (values in gaps count in no bin)."""
    counts = [0] * len(bins)
    n = 0
    for x in x_pcts:
        n += 1
        i = bin_index(float(x), bins)
        if i is not None:
            counts[i] += 1
    return tuple(c / n if n else 0.0 for c in counts)


def pdd_bins() -> tuple[HitBin, ...]:
    """The 7 PDD bins with equal weights (for measuring, not for sampling)."""
    return _from_weights([1.0] * len(PDD_BINS_PCT))
