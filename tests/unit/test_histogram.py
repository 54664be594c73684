"""testbed.histogram: buckets, quantiles that never under-state, snapshot differences."""

from __future__ import annotations

import random

import numpy as np
import pytest

from testbed.histogram import (LatencyHistogram, bucket_of, difference, merge, percentile,
                               quantile_ms, upper_edge_ms)


def test_a_quantile_is_at_or_above_the_exact_one_and_within_one_bucket():
    rng = random.Random(3)
    values = [rng.lognormvariate(0.0, 2.0) for _ in range(20_000)]  # ms, 1 us .. seconds
    h = LatencyHistogram()
    for v in values:
        h.add_ms(v)
    d = h.to_dict()
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = ordered[int(q * len(ordered)) - 1]
        got = quantile_ms(d, q)
        assert exact <= got <= exact * 2 ** (1 / 8) * 1.0001, (q, exact, got)
    assert quantile_ms(d, 1.0) == pytest.approx(max(values))


def test_buckets_cover_sub_microsecond_and_clip_at_the_top():
    assert bucket_of(0.0) == 0 and bucket_of(-1.0) == 0
    assert bucket_of(0.001) == 1
    assert upper_edge_ms(bucket_of(5.0)) > 5.0 >= upper_edge_ms(bucket_of(5.0) - 1)
    assert bucket_of(1e9) == bucket_of(1e12)  # everything huge lands in the last bucket


def test_the_difference_of_two_snapshots_is_the_window_between_them():
    h = LatencyHistogram()
    for v in (0.1, 0.2, 50.0):  # before the window
        h.add_ms(v)
    before = h.to_dict()
    for v in [1.0] * 99 + [8.0]:
        h.add_ms(v)
    window = difference(h.to_dict(), before)
    assert window["n"] == 100
    assert window["sum_ms"] == pytest.approx(107.0)
    assert quantile_ms(window, 0.5) == pytest.approx(upper_edge_ms(bucket_of(1.0)))
    assert quantile_ms(window, 0.995) == pytest.approx(upper_edge_ms(bucket_of(8.0)))
    assert difference(before, None) == before


def test_merge_adds_processes_and_empty_is_none():
    a, b = LatencyHistogram(), LatencyHistogram()
    a.add_ms(1.0)
    b.add_ms(3.0)
    b.add_ms(3.0)
    m = merge([a.to_dict(), b.to_dict()])
    assert m["n"] == 3 and m["max_ms"] == 3.0
    assert quantile_ms(m, 0.5) == 3.0  # the upper edge, clipped to the maximum seen
    assert quantile_ms(a.to_dict(), 0.5) == 1.0
    assert quantile_ms(LatencyHistogram().to_dict(), 0.5) is None


def test_percentile_is_numpys_to_the_last_bit():
    rng = random.Random(7)
    for n in (1, 2, 3, 7, 40, 121):
        xs = [rng.lognormvariate(0, 2) for _ in range(n)]
        for q in (0, 1, 25, 50, 90, 99, 99.9, 100, rng.uniform(0, 100)):
            assert percentile(xs + [None], q) == float(np.percentile(np.asarray(xs), q))
    assert percentile([None], 50) is None
    with pytest.raises(ValueError, match="0..100"):
        percentile([1.0], 101)


def test_the_slope_is_least_squares_per_minute():
    from testbed.histogram import slope_per_min
    assert slope_per_min([(0, 100), (30, 110), (60, 120)]) == pytest.approx(20.0)
    # the fit, not the last minus the first over the span (which reads 0.667)
    assert slope_per_min([(0, 10), (60, 12), (120, 10), (180, 12)]) == pytest.approx(0.4)
    assert slope_per_min([(0, 5)]) is None and slope_per_min([(1, 5), (1, 6)]) is None
