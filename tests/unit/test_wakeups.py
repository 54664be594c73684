"""The host wake-up measurement behind `testbed check` (testbed/net/wakeups.py)."""

from __future__ import annotations

import pytest

from testbed.net import wakeups as W


def test_steal_and_total_come_from_the_aggregate_cpu_line(tmp_path):
    (tmp_path / "stat").write_text("cpu  30 0 6 200 4 0 2 9 0 0\ncpu0 10 0 2 100 4 0 1 7\n")
    assert W.read_steal(tmp_path) == (9, 251)
    (tmp_path / "stat").write_text("intr 1\n")
    with pytest.raises(ValueError, match="no aggregate cpu line"):
        W.read_steal(tmp_path)


def test_the_summary_counts_sleeps_over_a_millisecond():
    late = [0.1] * 97 + [1.5, 2.0, 3.0]
    s = W.summarize(late, True, 0.0123456, 1.0, 50.0)
    assert s["sleeps"] == 100 and s["over_1ms_share"] == 0.03
    assert s["p50_ms"] == 0.1 and s["max_ms"] == 3.0 and s["steal_share"] == 0.0123
    assert 1.5 < s["p99_ms"] < 3.0  # numpy's linear percentile between the 99th and 100th


def test_a_short_measurement_sleeps_and_reports_how_late_it_woke():
    w = W.measure_wakeups(seconds=0.3, lo_ms=1.0, hi_ms=5.0)
    assert 20 <= w["sleeps"] <= 300  # 0.3 s of 1-5 ms sleeps, each one at least its span
    assert 0.0 <= w["p50_ms"] <= w["p99_ms"] <= w["max_ms"]
    assert w["sleep_ms"] == [1.0, 5.0]


def test_the_check_lines_say_whether_the_delay_lines_tolerance_is_within_reach():
    ok = W.summarize([0.05] * 100, True, 0.0, 1.0, 50.0)
    assert "within the delay lines' 1 ms p99" in "\n".join(W.format_wakeups(ok))
    bad = W.summarize([0.1] * 90 + [2.0] * 10, False, None, 1.0, 50.0)
    text = "\n".join(W.format_wakeups(bad))
    assert "normal priority (not root)" in text and "CPU steal -" in text
    assert "10.0% over 1 ms" in text and "will read degraded on lateness" in text


def test_a_backwards_span_is_refused():
    with pytest.raises(ValueError, match="need 0 < lo <= hi"):
        W.measure_wakeups(seconds=0.1, lo_ms=5.0, hi_ms=1.0)
