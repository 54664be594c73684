"""Several seeds of one scenario: every metric and ratio with its spread and a 95% interval.

Owns ``seeds_table`` (the summaries of one scenario's runs on different
seeds -> per mode and metric, and per comparison with the baseline, the
values, median, mean and a 95% confidence interval of the mean; per
expectation, its values, how many runs passed, its interval and whether
the bound lies inside it: a verdict the interval does not settle; null for
an equality bound such as "no token lost"; and its verdict over the seeds,
judged on the median or, where the scenario says ``judged_on: interval``,
on the interval's conservative end: ``judge``), ``seeds_markdown`` and ``t_975``. Pure: the
caller runs the seeds (``testbed run --seeds N``) and writes seeds.json /
seeds.md beside their run directories.

The interval is Student's t interval of the mean over the runs, which are
independent draws of the same scenario (another seed: another workload
sample, other network draws, another order of simultaneous events):
``mean +- t(0.975, n - 1) * s / sqrt(n)``, ``s`` the sample standard
deviation. A ratio against the baseline is taken per seed (the two modes of
one run share the workload) and its interval is over those ratios. With one
run there is no interval (null).

Example::

    table = seeds_table([("seed 1", s1), ("seed 2", s2), ("seed 3", s3)])
    table["modes"]["pdd"]["ttft_p90_s"]["ci95"]        # (low, high)
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence

from testbed.report.spread import _BOUND, bound_value

# the two-sided 95% quantile of Student's t, by degrees of freedom (1-30); above: normal
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
METRICS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "tpot_p50_ms", "e2e_p99_s",
           "goodput_rps", "rld_token_share", "relayed_share", "wan_bytes", "requests_failed",
           "tokens_lost", "tokens_duplicated")
RATIOS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "e2e_p99_s", "goodput_rps")


def t_975(df: int) -> float:
    """Student's t quantile 0.975 at ``df`` degrees of freedom (1.96 above 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def describe(values: Sequence[float]) -> dict:
    """values, n, median, mean, sd and the 95% t interval of the mean (None for n < 2)."""
    n = len(values)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if n > 1 else None
    ci = None
    if sd is not None:
        half = t_975(n - 1) * sd / math.sqrt(n)
        ci = (mean - half, mean + half)
    return {"values": list(values), "n": n, "median": statistics.median(values), "mean": mean,
            "sd": sd, "ci95": ci}


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def judge(values: Sequence[float], ci, bound: str, on: str = "median") -> bool | None:
    """An expectation over several runs: its bound text's operator and number against the
    values' median (``on="median"``) or the conservative end of their 95% interval
    (``"interval"``: the upper end for ``<``/``<=``, the lower for ``>``/``>=``); an
    equality bound holds when every value equals it. None without values or a bound."""
    m = _BOUND.search(bound)
    if not values or m is None:
        return None
    op, b = m.group(1), float(m.group(2))
    if op == "==":
        return all(v == b for v in values)
    if on == "interval":
        if ci is None:
            return None
        x = ci[1] if op.startswith("<") else ci[0]
    else:
        x = statistics.median(values)
    return {"<": x < b, "<=": x <= b, ">": x > b, ">=": x >= b}[op]


def seeds_table(runs: Sequence[tuple[str, Mapping]], baseline: str | None = None,
                judged_on: Mapping[str, str] | None = None) -> dict:
    """See the module docstring; ``runs`` are (label, summary.json) pairs; ``baseline``
    the mode ratios are taken against (default: the first comparison's); ``judged_on``:
    expectation name -> "median" | "interval" (the scenario's ``judged_on``; default
    median)."""
    summaries = [s for _, s in runs]
    modes = list((summaries[0].get("modes") or {}) if summaries else ())
    if baseline is None:
        comps = (summaries[0].get("comparisons") or []) if summaries else []
        baseline = comps[0].get("baseline") if comps and isinstance(comps[0], Mapping) else None
        if baseline is None and "cross-dc-pd" in modes:
            baseline = "cross-dc-pd"
    out_modes, ratios = {}, {}
    for mode in modes:
        rows = {}
        for metric in METRICS:
            vals = [_num((s.get("modes") or {}).get(mode, {}).get(metric)) for s in summaries]
            vals = [v for v in vals if v is not None]
            if vals:
                rows[metric] = describe(vals)
        out_modes[mode] = rows
        if baseline and mode != baseline:
            mr = {}
            for metric in RATIOS:
                per = []
                for s in summaries:
                    a = _num((s.get("modes") or {}).get(mode, {}).get(metric))
                    b = _num((s.get("modes") or {}).get(baseline, {}).get(metric))
                    if a is not None and b:
                        per.append(a / b)
                if per:
                    mr[metric] = describe(per)
            ratios[mode] = mr
    exps = {}
    for label, s in runs:
        for e in s.get("expectations") or []:
            bound = re.sub(r"\s*\(.*\)$", "", str(e.get("bound")))  # this run's figures
            x = exps.setdefault(e["name"], {"bound": bound, "values": [],
                                             "passed": 0, "runs": 0})
            x["runs"] += 1
            x["passed"] += bool(e.get("passed"))
            v = _num(e.get("value"))
            if v is not None:
                x["values"].append(v)
    for x in exps.values():
        d = describe(x["values"]) if x["values"] else None
        x["ci95"] = d["ci95"] if d else None
        x["median"] = d["median"] if d else None
        b = bound_value(x["bound"])
        x["bound_value"] = b
        # an equality bound (no token lost) has no side to fall on: not judged by interval
        x["bound_inside_ci"] = None if "==" in x["bound"] or b is None or x["ci95"] is None \
            else x["ci95"][0] <= b <= x["ci95"][1]
    for name, x in exps.items():
        x["judged_on"] = (judged_on or {}).get(name) or "median"
        x["passed_over_seeds"] = judge(x["values"], x["ci95"], x["bound"], x["judged_on"])
    return {"labels": [label for label, _ in runs], "baseline": baseline, "modes": out_modes,
            "ratios": ratios, "expectations": exps,
            "clock": summaries[0].get("clock", "emulated") if summaries else None,
            "fidelity": [(s.get("fidelity") or {}).get("verdict") for s in summaries]}


def _g(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def _ci(ci) -> str:
    return "-" if ci is None else f"[{ci[0]:.4g}, {ci[1]:.4g}]"


def seeds_markdown(name: str, table: Mapping) -> str:
    out = [f"# {name}: {len(table['labels'])} seeds ({table['clock']} clock)", "",
           "Runs: " + ", ".join(f"{lb} ({fid or 'no verdict'})" for lb, fid in
                                zip(table["labels"], table["fidelity"])) + ".",
           "Interval: Student's t 95% interval of the mean over the runs "
           "(testbed/report/seeds.py).", ""]
    for mode, rows in table["modes"].items():
        out += [f"## {mode}", "", "| metric | median | mean | 95% CI | values |",
                "|---|---:|---:|---|---|"]
        for metric, d in rows.items():
            out.append(f"| {metric} | {_g(d['median'])} | {_g(d['mean'])} | {_ci(d['ci95'])} | "
                       + ", ".join(_g(v) for v in d["values"]) + " |")
        out.append("")
    if table["ratios"]:
        out += [f"## Ratios against {table['baseline']} (per seed)", "",
                "| mode | metric | median | mean | 95% CI |", "|---|---|---:|---:|---|"]
        for mode, rows in table["ratios"].items():
            for metric, d in rows.items():
                out.append(f"| {mode} | {metric} | {_g(d['median'])} | {_g(d['mean'])} | "
                           f"{_ci(d['ci95'])} |")
        out.append("")
    if table["expectations"]:
        yn = {True: "yes", False: "no", None: "-"}
        out += ["## Expectations", "",
                "| expectation | bound | runs passed | median | 95% CI | bound inside the CI | "
                "judged on | verdict |", "|---|---|---:|---:|---|---|---|---|"]
        for name_, x in table["expectations"].items():
            verdict = {True: "PASS", False: "FAIL", None: "-"}[x["passed_over_seeds"]]
            out.append(f"| {name_} | {x['bound']} | {x['passed']}/{x['runs']} | "
                       f"{_g(x['median'])} | {_ci(x['ci95'])} | {yn[x['bound_inside_ci']]} | "
                       f"{x['judged_on']} | {verdict} |")
    return "\n".join(out) + "\n"


# what a mode's summary must hold at 0 in every run (testbed/scenario/suite.py's checks)
ZERO_CHECKS = ("tokens_lost", "tokens_duplicated", "requests_mismatched", "requests_unrecorded")


def seeds_summary(runs: Sequence[tuple[str, Mapping]], table: Mapping) -> dict:
    """N seeds of one scenario as one summary.json-shaped dict, for the suite's matrix
    (``testbed suite --seeds N``): per mode each metric's median over the runs, and the
    most any run counted of the checks that must be 0; per expectation its median
    as the value, the bound with how it was judged and its interval, and the verdict
    over the seeds (``seeds_table``); ``passed`` when every expectation holds over the
    seeds and no run lost, duplicated or mis-recorded a token; fidelity degraded when
    any run was, with each run's reasons under its label."""
    summaries = [s for _, s in runs]
    modes: dict[str, dict] = {}
    for s in summaries:
        for mode, m in (s.get("modes") or {}).items():
            for k, v in m.items():
                if _num(v) is not None:
                    modes.setdefault(mode, {}).setdefault(k, []).append(_num(v))
    modes = {mode: {k: (max(v) if k in ZERO_CHECKS else statistics.median(v))
                    for k, v in m.items()} for mode, m in modes.items()}
    n = len(runs)
    exps = []
    for name, x in (table.get("expectations") or {}).items():
        ci = x.get("ci95")
        exps.append({"name": name, "value": x.get("median"),
                     "bound": f"{x['bound']} over {n} seeds, on the {x['judged_on']}"
                              + (f" (95% CI {_ci(ci)}; {x['passed']}/{x['runs']} runs passed)"
                                 if ci else f" ({x['passed']}/{x['runs']} runs passed)"),
                     "passed": x.get("passed_over_seeds") is not False})
    zero = all(m.get(k, 0) == 0 for m in modes.values() for k in ZERO_CHECKS)
    verdicts = [(s.get("fidelity") or {}).get("verdict") for s in summaries]
    fid = None
    if any(v is not None for v in verdicts):
        fid = {"verdict": "degraded" if "degraded" in verdicts else "faithful",
               "policy": (summaries[0].get("fidelity") or {}).get("policy"),
               "reasons": [f"{label}: {r}" for label, s in runs
                           for r in (s.get("fidelity") or {}).get("reasons") or []],
               "host_steal": None}
    first = summaries[0] if summaries else {}
    return {"seeds": n, "labels": [label for label, _ in runs], "clock": table.get("clock"),
            "backend": first.get("backend"), "scale": first.get("scale"), "modes": modes,
            "expectations": exps, "fidelity": fid,
            "passed": zero and all(e["passed"] for e in exps)}
