"""report.expectations: every bound op, ratio comparisons, null metrics, and
clear errors for expectations that name an unknown metric or mode."""

from __future__ import annotations

import pytest

from testbed.report.expectations import ExpectationError, evaluate

MODES = {
    "pdd": {"tokens_lost": 0, "ttft_p90_s": 1.0, "goodput_rps": 3.0, "handoff_stall_p99_ms": None,
            "wan_bytes": 100, "emulated": {"wan_bytes": 10, "intra_dc_bytes": 0}},
    "cross-dc-pd": {"tokens_lost": 0, "ttft_p90_s": 4.0, "goodput_rps": 2.0,
                    "handoff_stall_p99_ms": None, "wan_bytes": 0,
                    "emulated": {"wan_bytes": 0, "intra_dc_bytes": 0}},
}


def bound(op, value, metric="ttft_p90_s", mode="pdd"):
    return {"name": f"t{op}", "mode": mode, "metric": metric, "op": op, "value": value}


@pytest.mark.parametrize("op, value, passed", [
    ("==", 1.0, True), ("==", 2, False),
    ("<=", 1.0, True), ("<=", 0.5, False),
    ("<", 1.5, True), ("<", 1.0, False),
    (">=", 1.0, True), (">=", 1.5, False),
    (">", 0.5, True), (">", 1.0, False)])
def test_every_op(op, value, passed):
    [r] = evaluate([bound(op, value)], MODES)
    assert r == {"name": f"t{op}", "passed": passed, "value": 1.0,
                 "bound": f"ttft_p90_s of pdd {op} {value:g}"}


def test_emulated_metrics_can_be_bounded():
    [r] = evaluate([bound("==", 10, metric="emulated.wan_bytes")], MODES)
    assert r["passed"] and r["value"] == 10


@pytest.mark.parametrize("limits, passed", [
    ({"max_ratio": 0.6}, True), ({"max_ratio": 0.2}, False),
    ({"min_ratio": 0.2}, True), ({"min_ratio": 0.3}, False),
    ({"min_ratio": 0.2, "max_ratio": 0.3}, True), ({"min_ratio": 0.26, "max_ratio": 0.3}, False)])
def test_ratio_of_a_mode_to_a_baseline(limits, passed):
    exp = {"name": "ttft", "metric": "ttft_p90_s", "mode": "pdd", "baseline": "cross-dc-pd",
           **limits}
    [r] = evaluate([exp], MODES)
    assert r["passed"] is passed
    assert r["value"] == pytest.approx(0.25)
    assert r["bound"].startswith("ttft_p90_s pdd / cross-dc-pd ")
    assert "(1 / 4)" in r["bound"]


def test_a_null_metric_fails_and_says_so():
    [r] = evaluate([bound("<", 200, metric="handoff_stall_p99_ms")], MODES)
    assert r["passed"] is False and r["value"] is None
    assert "handoff_stall_p99_ms of pdd < 200" in r["bound"] and "null" in r["bound"]


def test_a_ratio_with_null_or_zero_baseline_fails_and_says_why():
    null = {"name": "n", "metric": "handoff_stall_p99_ms", "mode": "pdd",
            "baseline": "cross-dc-pd", "max_ratio": 1}
    zero = {"name": "z", "metric": "wan_bytes", "mode": "pdd", "baseline": "cross-dc-pd",
            "max_ratio": 1}
    r_null, r_zero = evaluate([null, zero], MODES)
    assert not r_null["passed"] and "value is null" in r_null["bound"]
    assert not r_zero["passed"] and "baseline is 0" in r_zero["bound"]


@pytest.mark.parametrize("exp, message", [
    ({"name": "x", "mode": "pdd", "metric": "ttft_p75_s", "op": "<", "value": 1},
     "unknown metric 'ttft_p75_s'"),
    ({"name": "x", "mode": "p-rld", "metric": "ttft_p90_s", "op": "<", "value": 1},
     "mode 'p-rld' did not run"),
    ({"name": "x", "mode": "pdd", "baseline": "same-dc-pd", "metric": "ttft_p90_s",
      "max_ratio": 1}, "baseline 'same-dc-pd' did not run"),
    ({"name": "x", "mode": "pdd", "metric": "ttft_p90_s", "op": "!=", "value": 1}, "op must be"),
    ({"name": "x", "mode": "pdd", "metric": "ttft_p90_s", "op": "<"}, "value must be a number"),
    ({"name": "x", "mode": "pdd", "metric": "ttft_p90_s", "op": "<", "value": 1, "tol": 1},
     "unknown keys ['tol']"),
    ({"name": "x", "mode": "pdd", "baseline": "cross-dc-pd", "metric": "ttft_p90_s"},
     "needs max_ratio or min_ratio"),
])
def test_a_broken_expectation_is_an_error_naming_it(exp, message):
    with pytest.raises(ExpectationError) as err:
        evaluate([bound("<", 5), exp], MODES)
    assert "expectation 1 ('x')" in str(err.value) and message in str(err.value)


def test_an_expectation_needs_a_name():
    with pytest.raises(ExpectationError, match="has no name"):
        evaluate([{"mode": "pdd", "metric": "tokens_lost", "op": "==", "value": 0}], MODES)


PAIRED_EXP = {"name": "p-md not slower", "metric": "paired_ttft_ratio_p50", "mode": "pdd",
              "baseline": "cross-dc-pd", "max_ratio": 1.1}


@pytest.mark.parametrize("value, passed", [(1.0, True), (1.1, True), (1.2, False)])
def test_a_paired_metric_is_bounded_as_the_ratio_it_already_is(value, passed):
    paired = {("pdd", "cross-dc-pd"): {"paired_ttft_ratio_p50": value, "n": 18}}
    [r] = evaluate([PAIRED_EXP], MODES, paired)
    assert r == {"name": "p-md not slower", "passed": passed, "value": value,
                 "bound": "paired_ttft_ratio_p50 pdd vs cross-dc-pd <= 1.1 "
                          "(median of 18 per-request ratios)"}


def test_a_paired_metric_with_no_pair_fails_and_says_why():
    paired = {("pdd", "cross-dc-pd"): {"paired_ttft_ratio_p50": None, "n": 0}}
    [r] = evaluate([PAIRED_EXP], MODES, paired)
    assert not r["passed"] and r["value"] is None and "no request to pair" in r["bound"]


def test_a_paired_metric_needs_its_pair_and_a_baseline():
    with pytest.raises(ExpectationError, match="no paired metrics for pdd vs cross-dc-pd"):
        evaluate([PAIRED_EXP], MODES)
    single = {k: v for k, v in PAIRED_EXP.items() if k not in ("baseline", "max_ratio")}
    with pytest.raises(ExpectationError, match="unknown metric 'paired_ttft_ratio_p50'"):
        evaluate([{**single, "op": "<=", "value": 1.1}], MODES)


def test_an_expectation_judged_on_its_interval_is_one_runs_bound_all_the_same():
    """``judged_on`` says how several seeds judge it (testbed/report/seeds.py); a run's
    metadata carries it, and one run is judged on its value."""
    ratio = {"name": "tail", "mode": "pdd", "metric": "ttft_p90_s", "baseline": "cross-dc-pd",
             "max_ratio": 0.3, "judged_on": "interval"}
    plain = dict(bound("<=", 1.0), judged_on="interval")
    r1, r2 = evaluate([ratio, plain], MODES)
    assert r1["passed"] and r1["value"] == 0.25 and r2["passed"]
