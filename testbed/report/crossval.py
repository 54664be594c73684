"""The virtual clock against the emulator: one table per scenario, the error per metric.

Owns ``crossval`` (summaries in, the comparison out), ``crossval_markdown``
and ``METRICS``. Pure: it reads summary.json objects (the runner's
``testbed/report/summary.py``), never a run.

Per scenario and mode, each metric of ``METRICS``: the emulated runs'
median, min and max (the emulator is the reference, and one emulated run
is not a reference: the median of several), the virtual runs' median, min
and max (one per tie seed: the order of simultaneous events, which a real
machine's noise decides, testbed/pdd/run/vloop.py), and the relative
error of the medians ``(virtual - emulated) / emulated``. A metric counts toward
the suite's mean absolute percentage error (MAPE) only in scenarios whose
emulated runs all read faithful: a degraded run measures the host as much
as PDD. ``overlap`` says whether the two ranges meet. Per expectation:
every verdict of both; ``agree`` is true when every run of both clocks
gives the same verdict, false when the emulated runs agree and a virtual
one differs, null when the emulated runs disagree among themselves (no
reference verdict).

Example::

    table = crossval({"quickstart": ([emu1, emu2, emu3], [virt0, virt1, virt2])})
    print(crossval_markdown(table))
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

# the figures a user reads off a run: latency, throughput, what the router chose, bytes
METRICS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_ms", "e2e_p99_s", "goodput_rps",
           "rld_token_share", "relayed_share", "wan_bytes", "intra_dc_bytes",
           "kv_prediction_error_p50")
TTFT_TARGET = 0.10  # TTFT p50/p90 within 10% (or within the emulator's own spread)
SUITE_MAPE_TARGET = 0.05
SHARE_TARGET = 0.02  # bytes and shares within 2%


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _faithful(summary: Mapping) -> bool:
    return ((summary.get("fidelity") or {}).get("verdict")) == "faithful"


def _verdicts(summary: Mapping) -> dict[str, bool]:
    return {e["name"]: bool(e["passed"]) for e in summary.get("expectations") or []}


def _values(summaries: Sequence[Mapping], mode: str, metric: str) -> list[float]:
    return [x for x in (_num((s.get("modes") or {}).get(mode, {}).get(metric))
                        for s in summaries) if x is not None]


def compare_scenario(emulated: Sequence[Mapping], virtual: Sequence[Mapping]) -> dict:
    """One scenario: per mode and metric, both clocks' median and range and the relative
    error of the medians; per expectation, the verdicts."""
    modes = {}
    for mode in (virtual[0].get("modes") or {}) if virtual else {}:
        rows = {}
        for metric in METRICS:
            emu, virt = _values(emulated, mode, metric), _values(virtual, mode, metric)
            if not emu or not virt:
                continue
            med, vmed = statistics.median(emu), statistics.median(virt)
            err = 0.0 if med == vmed else None if med == 0 else (vmed - med) / abs(med)
            rows[metric] = {"emulated": emu, "median": med, "min": min(emu), "max": max(emu),
                            "virtual_runs": virt, "virtual": vmed, "virtual_min": min(virt),
                            "virtual_max": max(virt), "rel_error": err,
                            "overlap": min(virt) <= max(emu) and min(emu) <= max(virt)}
        modes[mode] = rows
    verdicts = {}
    for name in (_verdicts(virtual[0]) if virtual else {}):
        emu_v = [v for v in (_verdicts(s).get(name) for s in emulated) if v is not None]
        virt_v = [v for v in (_verdicts(s).get(name) for s in virtual) if v is not None]
        same = len(set(emu_v)) == 1
        verdicts[name] = {"emulated": emu_v, "virtual": virt_v,
                          "agree": (set(virt_v) == set(emu_v)) if emu_v and same else None}
    return {"runs": len(emulated), "virtual_runs": len(virtual), "faithful": all(_faithful(s) for s in emulated) and
            bool(emulated), "fidelity": [(s.get("fidelity") or {}).get("verdict")
                                         for s in emulated],
            "modes": modes, "expectations": verdicts}


def crossval(pairs: Mapping[str, tuple[Sequence[Mapping], Sequence[Mapping]]],
             refused: Mapping[str, str] | None = None,
             sources: Mapping[str, Sequence[str]] | None = None) -> dict:
    """Every scenario's comparison and the suite's MAPE per metric (faithful scenarios);
    ``sources``: per scenario, where its emulated runs came from (shown in the table)."""
    scenarios = {name: compare_scenario(emu, virt) for name, (emu, virt) in pairs.items()}
    for name, src in (sources or {}).items():
        if name in scenarios:
            scenarios[name]["sources"] = list(src)
    errors: dict[str, list[float]] = {m: [] for m in METRICS}
    for sc in scenarios.values():
        if not sc["faithful"]:
            continue
        for rows in sc["modes"].values():
            for metric, row in rows.items():
                if row["rel_error"] is not None:
                    errors[metric].append(abs(row["rel_error"]))
    mape = {m: (statistics.fmean(v) if v else None) for m, v in errors.items()}
    agree = [v["agree"] for sc in scenarios.values() for v in sc["expectations"].values()
             if v["agree"] is not None]
    return {"scenarios": scenarios, "mape": mape, "mape_n": {m: len(v) for m, v in errors.items()},
            "verdicts_agree": sum(agree), "verdicts_compared": len(agree),
            "refused": dict(refused or {})}


def _f(v: float | None, metric: str = "") -> str:
    if v is None:
        return "-"
    if metric == "wan_bytes" or metric == "intra_dc_bytes":
        return f"{v:.4g}"
    return f"{v:.4g}"


def crossval_markdown(table: Mapping) -> str:
    out = ["# Virtual clock vs emulator", "",
           "Per scenario and mode: the emulated runs' median [min, max], the virtual "
           "runs' (one per tie seed) and the error of the virtual median against the "
           "emulated one (testbed/report/crossval.py). MAPE counts scenarios whose emulated "
           "runs all read faithful.", ""]
    out += ["## Mean absolute percentage error over the suite", "",
            "| metric | MAPE | values |", "|---|---:|---:|"]
    for m, v in table["mape"].items():
        out.append(f"| {m} | {'-' if v is None else f'{100 * v:.1f}%'} | {table['mape_n'][m]} |")
    out += ["", f"Expectation verdicts: {table['verdicts_agree']} of "
            f"{table['verdicts_compared']} agree with the emulated runs' (where those agree "
            "among themselves).", ""]
    for name, sc in table["scenarios"].items():
        fid = ", ".join(str(f) for f in sc["fidelity"])
        out += [f"## {name}", "", f"{sc['runs']} emulated runs ({fid}); "
                f"{sc['virtual_runs']} virtual."]
        if sc.get("sources"):
            out.append("Emulated runs: " + "; ".join(f"`{x}`" for x in sc["sources"]) + ".")
        out += ["",
                "| mode | metric | emulated median [min, max] | virtual median [min, max] | "
                "error |", "|---|---|---|---|---:|"]
        for mode, rows in sc["modes"].items():
            for metric, r in rows.items():
                err = "-" if r["rel_error"] is None else f"{100 * r['rel_error']:+.1f}%"
                mark = "" if r["overlap"] else " *"
                out.append(f"| {mode} | {metric} | {_f(r['median'])} [{_f(r['min'])}, "
                           f"{_f(r['max'])}] | {_f(r['virtual'])} [{_f(r['virtual_min'])}, "
                           f"{_f(r['virtual_max'])}] | {err}{mark} |")
        bad = [n for n, v in sc["expectations"].items() if v["agree"] is False]
        if bad:
            out += ["", "Verdicts that differ: " + "; ".join(
                f"{n} (emulated {sc['expectations'][n]['emulated']}, virtual "
                f"{sc['expectations'][n]['virtual']})" for n in bad)]
        out.append("")
    out.append("`*`: the two clocks' ranges do not meet.")
    if table["refused"]:
        out += ["", "## Refused by the virtual clock", ""]
        out += [f"- {name}: {why}" for name, why in table["refused"].items()]
    return "\n".join(out) + "\n"
