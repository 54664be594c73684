"""Log-bucketed latency histograms: cumulative counters a process reports and a report reads.

Owns ``LatencyHistogram`` (fixed bucket edges, so two snapshots of one
process subtract into the histogram of the window between them) and
``quantile_ms`` on its plain-data form. The delay line (its frames'
lateness) and every role (its event loop's lag) keep one; the report turns
snapshot differences into p50/p99 of a workload window. Also owns
``slope_per_min`` (a least-squares trend of a gauge: memory, descriptors) and
``percentile``, the one exact percentile of a list of samples (numpy's
linear method) that the report's metrics and the runner's verification
use. Imports nothing of the testbed, so every layer may use it.

Buckets: [0, 1 us), then 8 per octave from 1 us to ~69 s (edges
``1 us * 2**(i/8)``): a quantile is reported as the upper edge of the
bucket it falls in, at most 9% above the true value, never below it.

Example::

    h = LatencyHistogram()
    h.add_ms(0.4); h.add_ms(12.0)
    d = h.to_dict()                   # {"n": 2, "sum_ms": 12.4, "max_ms": 12.0, "counts": {...}}
    quantile_ms(d, 0.99)              # 12.0 (its bucket's upper edge, clipped to the maximum)
"""

from __future__ import annotations

import math

PER_OCTAVE = 8
FIRST_EDGE_MS = 0.001
N_BUCKETS = 1 + PER_OCTAVE * 26  # the last bucket's upper edge: ~67 s


def bucket_of(ms: float) -> int:
    """The bucket index of a value in ms (0: below 1 us; the last one takes everything above)."""
    if ms < FIRST_EDGE_MS:
        return 0
    i = 1 + int(math.floor(math.log2(ms / FIRST_EDGE_MS) * PER_OCTAVE))
    return min(i, N_BUCKETS - 1)


def upper_edge_ms(i: int) -> float:
    """Upper edge of bucket ``i`` in ms."""
    return FIRST_EDGE_MS * 2 ** (i / PER_OCTAVE)


class LatencyHistogram:
    """Counts of values (ms) per bucket, their number, sum and maximum; cumulative."""

    def __init__(self) -> None:
        self.counts = [0] * N_BUCKETS
        self.n = 0
        self.sum_ms = 0.0
        self.max_ms = 0.0

    def add_ms(self, ms: float) -> None:
        ms = max(ms, 0.0)
        self.counts[bucket_of(ms)] += 1
        self.n += 1
        self.sum_ms += ms
        if ms > self.max_ms:
            self.max_ms = ms

    def to_dict(self) -> dict:
        """Plain data, sparse (only non-empty buckets, keys as strings for JSON)."""
        return {"n": self.n, "sum_ms": round(self.sum_ms, 6), "max_ms": round(self.max_ms, 6),
                "counts": {str(i): c for i, c in enumerate(self.counts) if c}}


def difference(later: dict, earlier: dict | None) -> dict:
    """The histogram of the values added between two snapshots of one histogram
    (``max_ms`` is the later snapshot's: a cumulative maximum cannot be subtracted,
    so it bounds the window's from above)."""
    if earlier is None:
        return later
    counts = {k: c - earlier["counts"].get(k, 0) for k, c in later["counts"].items()}
    return {"n": later["n"] - earlier["n"], "sum_ms": later["sum_ms"] - earlier["sum_ms"],
            "max_ms": later["max_ms"], "counts": {k: c for k, c in counts.items() if c > 0}}


def merge(parts: list[dict]) -> dict:
    """One histogram of several (e.g. a role's processes before and after a restart)."""
    counts: dict[str, int] = {}
    for p in parts:
        for k, c in p["counts"].items():
            counts[k] = counts.get(k, 0) + c
    return {"n": sum(p["n"] for p in parts), "sum_ms": sum(p["sum_ms"] for p in parts),
            "max_ms": max((p["max_ms"] for p in parts), default=0.0), "counts": counts}


def quantile_ms(hist: dict, q: float) -> float | None:
    """The q-quantile (0 < q <= 1) as the upper edge of its bucket; None when empty."""
    n = hist["n"]
    if n <= 0:
        return None
    rank = q * n
    seen = 0
    for i in sorted(int(k) for k in hist["counts"]):
        seen += hist["counts"][str(i)]
        if seen >= rank:
            return min(upper_edge_ms(i), hist["max_ms"]) if hist["max_ms"] else upper_edge_ms(i)
    return hist["max_ms"]


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0-100) of the non-null values, numpy's default linear
    interpolation to the last bit (``numpy.percentile(values, q)``, whose ``_lerp``
    this follows); None when there are none.

    >>> percentile([4, None, 1, 3, 2], 50), percentile([], 90)
    (2.5, None)
    """
    v = sorted(float(x) for x in values if x is not None)
    if not v:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q!r}: expected 0..100")
    pos = (len(v) - 1) * (q / 100)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    t, a, b = pos - lo, v[lo], v[hi]
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def slope_per_min(points) -> float | None:
    """Least-squares slope of (t seconds, value) points, in value per minute (rounded
    to 1e-4); None for fewer than two points or a single time.

    >>> slope_per_min([(0, 10.0), (30, 10.5), (60, 11.0)])
    1.0
    """
    pts = [(float(t), float(v)) for t, v in points]
    if len(pts) < 2:
        return None
    n = len(pts)
    mt, mv = sum(t for t, _ in pts) / n, sum(v for _, v in pts) / n
    den = sum((t - mt) ** 2 for t, _ in pts)
    return None if den == 0 else round(60 * sum((t - mt) * (v - mv) for t, v in pts) / den, 4) + 0.0
