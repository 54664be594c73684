"""Checking a scenario's expectations against the metrics of a run.

Owns ExpectationError, OPS and ``evaluate``. Expectations are plain data
(the ``expectations`` list of metadata.json's resolved scenario), of two
shapes:

- a bound on one metric of one mode::

    {name: no-token-lost, mode: pdd, metric: tokens_lost, op: "==", value: 0}

  ``op`` is one of ==, <=, <, >=, >;
- a comparison of a mode with a baseline mode (value = mode / baseline)::

    {name: ttft-halved, metric: ttft_p90_s, mode: pdd, baseline: cross-dc-pd,
     max_ratio: 0.6}                # and/or min_ratio

- the same shape with a paired metric (``PAIRED_METRICS``): the value is
  already a ratio over the same requests in both modes, and the bound
  applies to it::

    {name: p-md not slower, metric: paired_ttft_ratio_p50, mode: pdd,
     baseline: cross-dc-pd, max_ratio: 1.1}

A null metric (e.g. no completed request) or a zero baseline fails, and
the bound text says why. A malformed expectation, an unknown metric or a
mode that did not run raises ExpectationError naming the expectation:
that is a broken scenario, not a failed run.

Example::

    evaluate(resolved["expectations"], summary["modes"], paired)
    # [{"name": "ttft-halved", "passed": True, "value": 0.48,
    #   "bound": "ttft_p90_s pdd / cross-dc-pd <= 0.6 (1.2 / 2.5)"}]
"""

from __future__ import annotations

import operator
from typing import Callable, Mapping, Sequence

from testbed.errors import TestbedError
from testbed.report.metrics import MODE_METRICS, PAIRED_METRICS, metric_value, ratio

OPS: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq, "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}
# judged_on: how the bound is judged over several seeds (testbed/report/seeds.py); one run
# is judged on its value either way
BOUND_KEYS = frozenset({"name", "mode", "metric", "op", "value", "description", "judged_on"})
RATIO_KEYS = frozenset({"name", "mode", "metric", "baseline", "max_ratio", "min_ratio",
                        "judged_on", "description"})


class ExpectationError(TestbedError):
    """An expectation that cannot be evaluated (malformed, unknown metric or mode)."""

    def __init__(self, index: int, name: object, problem: str):
        self.index, self.name, self.problem = index, name, problem
        super().__init__(f"expectation {index} ({name!r}): {problem}")


Paired = Mapping[tuple[str, str], Mapping]


def evaluate(expectations: Sequence[Mapping], modes: Mapping[str, Mapping],
             paired: Paired | None = None) -> list[dict]:
    """[{name, passed, value, bound}] for each expectation, in order. ``paired`` maps
    (mode, baseline) to that pair's ``metrics.paired_metrics``; an expectation on a paired
    metric of a pair it lacks raises ExpectationError."""
    return [_evaluate_one(i, e, modes, paired or {}) for i, e in enumerate(expectations)]


def _evaluate_one(index: int, exp: Mapping, modes: Mapping[str, Mapping],
                  paired: Paired) -> dict:
    if not isinstance(exp, Mapping):
        raise ExpectationError(index, None, f"expected a mapping, got {exp!r}")
    name = exp.get("name")
    if not name:
        raise ExpectationError(index, name, "has no name")
    is_ratio = "baseline" in exp
    _check_keys(index, exp, RATIO_KEYS if is_ratio else BOUND_KEYS)
    metric = exp.get("metric")
    known = MODE_METRICS + PAIRED_METRICS if is_ratio else MODE_METRICS
    if metric not in known:
        raise ExpectationError(index, name, f"unknown metric {metric!r}; known: "
                               + ", ".join(known))
    for key in ("mode", "baseline") if is_ratio else ("mode",):
        if exp.get(key) not in modes:
            raise ExpectationError(index, name, f"{key} {exp.get(key)!r} did not run; modes: "
                                   + ", ".join(modes))
    if metric in PAIRED_METRICS:
        pair = paired.get((exp["mode"], exp["baseline"]))
        if pair is None:
            raise ExpectationError(index, name, f"no paired metrics for {exp['mode']} vs "
                                   f"{exp['baseline']}")
        passed, value, bound = _paired_check(index, exp, pair)
    else:
        check = _ratio_check if is_ratio else _bound_check
        passed, value, bound = check(index, exp, modes)
    return {"name": name, "passed": passed, "value": value, "bound": bound}


def _check_keys(index: int, exp: Mapping, allowed: frozenset) -> None:
    unknown = sorted(set(exp) - allowed)
    if unknown:
        raise ExpectationError(index, exp["name"], f"unknown keys {unknown}; allowed: "
                               + ", ".join(sorted(allowed)))


def _number(index: int, exp: Mapping, key: str) -> float:
    v = exp.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ExpectationError(index, exp["name"], f"{key} must be a number, got {v!r}")
    return v


def _bound_check(index: int, exp: Mapping, modes: Mapping) -> tuple[bool, object, str]:
    op = exp.get("op")
    if op not in OPS:
        raise ExpectationError(index, exp["name"], f"op must be one of {' '.join(OPS)}, "
                               f"got {op!r}")
    want = _number(index, exp, "value")
    metric, mode = exp["metric"], exp["mode"]
    value = metric_value(modes[mode], metric)
    bound = f"{metric} of {mode} {op} {want:g}"
    if value is None:
        return False, None, f"{bound} (value is null: no data, e.g. no completed request)"
    return bool(OPS[op](value, want)), value, bound


def _ratio_check(index: int, exp: Mapping, modes: Mapping) -> tuple[bool, object, str]:
    limits = _limits(index, exp)
    metric, mode, base = exp["metric"], exp["mode"], exp["baseline"]
    v, b = metric_value(modes[mode], metric), metric_value(modes[base], metric)
    r = ratio(v, b)
    wanted = _wanted(limits)
    bound = f"{metric} {mode} / {base} {wanted}"
    if r is None:
        why = ("value is null" if v is None else "baseline is null" if b is None
               else "baseline is 0")
        return False, None, f"{bound} ({why}: {_fmt(v)} / {_fmt(b)})"
    ok = _within(r, limits)
    return ok, r, f"{bound} ({_fmt(v)} / {_fmt(b)})"


def _limits(index: int, exp: Mapping) -> list[tuple[str, float]]:
    limits = [(k, _number(index, exp, k)) for k in ("min_ratio", "max_ratio") if k in exp]
    if not limits:
        raise ExpectationError(index, exp["name"], "a comparison needs max_ratio or min_ratio")
    return limits


def _wanted(limits: list[tuple[str, float]]) -> str:
    return " and ".join(f"{'>=' if k == 'min_ratio' else '<='} {x:g}" for k, x in limits)


def _within(r: float, limits: list[tuple[str, float]]) -> bool:
    return all(r >= x if k == "min_ratio" else r <= x for k, x in limits)


def _paired_check(index: int, exp: Mapping, pair: Mapping) -> tuple[bool, object, str]:
    limits = _limits(index, exp)
    metric, mode, base = exp["metric"], exp["mode"], exp["baseline"]
    r, n = pair.get(metric), pair.get("n", 0)
    wanted = _wanted(limits)
    bound = f"{metric} {mode} vs {base} {wanted}"
    if r is None:
        return False, None, f"{bound} (no request to pair: none completed in both " \
                            f"without a relay)"
    ok = _within(r, limits)
    return ok, r, f"{bound} (median of {n} per-request ratios)"


def _fmt(v: float | None) -> str:
    return "null" if v is None else f"{v:.4g}"
