"""testbed.report.resources: slopes of the gauges a role's probe writes, the last process
of a restarted instance, loop lag per minute, and what a mode's bound reads."""

from __future__ import annotations

import pytest

from testbed.histogram import LatencyHistogram
from testbed.report.resources import instance_resources, lag_by_minute, mode_resources


def snapshots(role, pid, t0, t1, rss, fds=lambda t: 20, lag_ms=lambda t: 0.5, every=1.0):
    """A process's cumulative snapshots, one per ``every`` s, with gauges given as
    functions of time and one loop-lag sample per second of ``lag_ms(t)``."""
    h, out, t = LatencyHistogram(), [], t0
    while t <= t1 + 1e-9:
        h.add_ms(lag_ms(t))
        out.append({"t_mono": t, "pid": pid, "role": role, "loop_lag": h.to_dict(),
                    "rss_mb": rss(t), "fds": fds(t)})
        t += every
    return out


def test_a_cache_that_fills_then_holds_has_a_flat_second_half():
    # grows 2 MB/min for the first 10 minutes, then holds: not a leak
    rows = snapshots("prefill", 1, 0, 1200, rss=lambda t: 100 + 2 * min(t, 600) / 60)
    f = instance_resources(rows, (0, 1200))
    assert f["rss_slope_mb_per_min"] == pytest.approx(0.0, abs=1e-6)
    assert f["rss_slope_all_mb_per_min"] > 0.5
    assert (f["rss_first_mb"], f["rss_peak_mb"], f["minutes"]) == (100, 120, 20.0)


def test_a_leak_shows_in_memory_and_descriptors():
    rows = snapshots("main_decode", 1, 0, 1200, rss=lambda t: 100 + 0.8 * t / 60,
                     fds=lambda t: 20 + int(t // 30))
    f = instance_resources(rows, (0, 1200))
    assert f["rss_slope_mb_per_min"] == pytest.approx(0.8, rel=1e-3)
    assert f["fd_slope_per_min"] == pytest.approx(2.0, rel=0.05)
    assert (f["fds_first"], f["fds_peak"]) == (20, 60)


def test_a_restarted_instance_is_judged_on_its_last_process():
    first = snapshots("main_decode", 7, 0, 300, rss=lambda t: 400)
    second = snapshots("main_decode", 8, 305, 900, rss=lambda t: 150)
    f = instance_resources(first + second, (0, 900))
    assert f["processes"] == 2 and f["rss_first_mb"] == 150 and f["rss_peak_mb"] == 150
    assert f["rss_slope_mb_per_min"] == pytest.approx(0.0, abs=1e-6)


def test_loop_lag_per_minute_follows_a_loop_that_slows():
    rows = snapshots("router", 1, 0, 180, rss=lambda t: 50,
                     lag_ms=lambda t: 1.0 if t <= 60 else 5.0 if t <= 120 else 20.0)
    lags = lag_by_minute(rows, 0, 180)
    assert len(lags) == 3 and lags[0] < lags[1] < lags[2]
    assert lags[2] == pytest.approx(20.0, rel=0.1)  # a bucket's upper edge, at most 9% above


def test_the_mode_bound_reads_serving_roles_only():
    stats = {"client": snapshots("client", 1, 0, 600, rss=lambda t: 50 + t / 10),
             "p1": snapshots("prefill", 2, 0, 600, rss=lambda t: 300 + 0.2 * t / 60),
             "md1": snapshots("main_decode", 3, 0, 600, rss=lambda t: 200,
                              fds=lambda t: 30 + (t % 2))}
    m = mode_resources(stats, (0, 600))
    assert set(m["instances"]) == {"client", "p1", "md1"}
    assert m["instances"]["client"]["rss_slope_mb_per_min"] == pytest.approx(6.0)
    assert m["rss_slope_max_mb_per_min"] == pytest.approx(0.2, rel=1e-3)
    assert m["rss_slope_max_instance"] == "p1"
    assert abs(m["fd_slope_max_per_min"]) < 0.05


def test_snapshots_without_gauges_give_no_figures():
    rows = snapshots("router", 1, 0, 10, rss=lambda t: None, fds=lambda t: None)
    assert instance_resources(rows, None) is None
    assert mode_resources({"r": rows}, None) == {
        "instances": {}, "rss_slope_max_mb_per_min": None, "rss_slope_max_instance": None,
        "fd_slope_max_per_min": None, "fd_slope_max_instance": None}
