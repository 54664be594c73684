"""summary.json: assembling the contract from a loaded run.

Owns BASELINE_MODE, ``summarize``, ``comparison_plan`` and ``summary_json``.
The keys and their order are docs/run-directory.md's contract; metrics come
from ``testbed.report.metrics``, expectation results from
``testbed.report.expectations``. Besides the loaded run it reads only the
mode folders' own files (verify.json, workload.jsonl, the roles' stats: the
fidelity verdict and ``resources``); the caller writes summary.json.

Comparisons: every mode against the baseline (the scenario's ``baseline``
if it names a mode that ran, else ``cross-dc-pd`` if it ran, else the first
mode) on DEFAULT_COMPARED, plus every (mode, baseline) pair and metric a
comparison expectation names.

Example::

    summary = summarize(load_run("runs/wan-fault"))
    summary["modes"]["pdd"]["ttft_p90_s"], summary["passed"]
"""

from __future__ import annotations

import json

from testbed.report import fidelity
from testbed.report.balance import instance_roles
from testbed.report.expectations import evaluate
from testbed.report.resources import mode_resources
from testbed.report.metrics import (DEFAULT_COMPARED, PAIRED_METRICS, Sla, compare,
                                    mode_metrics, paired_metrics, workload_window)
from testbed.report.rundir import RunData
from testbed.types import PDD_DEFAULTS

BASELINE_MODE = "cross-dc-pd"


def baseline_of(run: RunData) -> str | None:
    names = run.mode_names
    wanted = run.resolved.get("baseline")
    if wanted in names:
        return wanted
    if BASELINE_MODE in names:
        return BASELINE_MODE
    return names[0] if names else None


def comparison_plan(run: RunData) -> tuple[list[str], list[tuple[str, str]]]:
    """(metrics, (mode, baseline) pairs) to compare."""
    base = baseline_of(run)
    metrics = list(DEFAULT_COMPARED)
    pairs = [(m, base) for m in run.mode_names if base is not None and m != base]
    for e in run.resolved.get("expectations") or []:
        if "baseline" not in e:
            continue
        if (e["mode"], e["baseline"]) not in pairs:
            pairs.append((e["mode"], e["baseline"]))
        if e["metric"] not in metrics and e["metric"] not in PAIRED_METRICS:
            metrics.append(e["metric"])
    return metrics, pairs


def tokens_intact(mode: dict) -> bool:
    return (mode["tokens_lost"] == 0 and mode["tokens_duplicated"] == 0
            and not mode.get("requests_mismatched") and not mode.get("requests_unrecorded"))


def failures(modes: dict, results: list[dict]) -> list[str]:
    """Why a run did not pass, one line each (empty when it passed)."""
    out = [f"expectation failed: {r['name']} ({r['value']}, bound {r['bound']})"
           for r in results if not r["passed"]]
    for name, m in modes.items():
        for key, what in (("tokens_lost", "token positions never delivered"),
                          ("tokens_duplicated", "token positions delivered twice"),
                          ("requests_mismatched", "requests whose tokens differ from a "
                                                  "single-process greedy decode"),
                          ("requests_unrecorded", "requests of the workload without a record "
                                                  "(the client did not end them: its log says "
                                                  "why)")):
            if m.get(key):
                failed = f" ({m['requests_failed']} requests failed)" \
                    if key == "tokens_lost" and m.get("requests_failed") else ""
                out.append(f"{name}: {m[key]} {what}{failed}")
    return out


def unrecorded(run: RunData, mode) -> dict:
    """``requests_unrecorded``: how many requests of MODE/workload.jsonl (warm-up ones
    aside) have no record in requests.jsonl; {} when the workload file is absent (a
    gateway's run, whose requests come from outside)."""
    path = run.path / mode.name / "workload.jsonl"
    if not path.is_file():
        return {}
    wanted = set()
    for line in path.read_text().splitlines():
        try:
            w = json.loads(line)
        except ValueError:
            continue
        if isinstance(w, dict) and not w.get("warmup"):
            wanted.add(w.get("id"))
    return {"requests_unrecorded": len(wanted - {r.get("id") for r in mode.requests})}


def instances_of(run: RunData, mode: str) -> dict[str, str] | None:
    """MODE/cluster.json's serving instances, name -> role (testbed.report.balance);
    None when the file is absent or unreadable (the records name what they used)."""
    path = run.path / mode / "cluster.json"
    try:
        cluster = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return instance_roles(cluster) if isinstance(cluster, dict) else None


def verification(run: RunData, mode: str) -> dict:
    """MODE/verify.json (written by the runner: tokens vs a single-process greedy
    decode) as metrics: requests_verified, requests_mismatched; {} if absent."""
    path = run.path / mode / "verify.json"
    if not path.exists():
        return {}
    v = json.loads(path.read_text())
    return {"requests_verified": v["checked"], "requests_mismatched": len(v["mismatched"])}


def summarize(run: RunData) -> dict:
    """The summary.json object of a run (raises ExpectationError for a broken expectation)."""
    sla = Sla.from_resolved(run.resolved)
    resources = resources_of(run)
    modes = {m.name: mode_metrics(m.requests, m.events, sla, run.scale, m.links,
                                  float(run.pdd_settings(m.name).get(
                                      "relay_threshold_s", PDD_DEFAULTS.relay_threshold_s)),
                                  resources[m.name], instances_of(run, m.name))
             for m in run.modes}
    for mode in run.modes:  # nominal bytes are counts
        m = modes[mode.name]
        m["wan_bytes"], m["intra_dc_bytes"] = round(m["wan_bytes"]), round(m["intra_dc_bytes"])
        m.update(verification(run, mode.name))
        m.update(unrecorded(run, mode))
    metrics, pairs = comparison_plan(run)
    records = {m.name: m.requests for m in run.modes}
    paired = {(a, b): paired_metrics(records[a], records[b]) for a, b in pairs
              if a in records and b in records}
    results = evaluate(run.resolved.get("expectations") or [], modes, paired)
    untriggered = [f"{m.name}: fault {e.get('fault')} ({e.get('fault_kind')}) never started: "
                   f"its trigger '{e.get('trigger')}' saw {e.get('seen')} matching events"
                   for m in run.modes for e in m.events
                   if e.get("kind") == "fault_untriggered"]
    fid = fidelity_of(run)
    return {
        "scenario": run.metadata.get("scenario") or run.resolved.get("name") or run.path.name,
        "backend": run.metadata.get("backend"),
        "clock": run.metadata.get("clock", "emulated"),
        "scale": run.scale,
        "modes": modes,
        "comparisons": compare(modes, metrics, pairs),
        "paired": [{"mode": a, "baseline": b, **p} for (a, b), p in paired.items()],
        "expectations": results,
        "passed": all(r["passed"] for r in results) and all(map(tokens_intact, modes.values()))
        and not untriggered,
        "failures": failures(modes, results) + untriggered,
        "fidelity": fid,
        "resources": resources,
    }


def resources_of(run: RunData) -> dict:
    """summary.json's ``resources``: per mode, what each role process held over the
    workload window (testbed.report.resources)."""
    return {m.name: mode_resources(fidelity.role_stats(run.path / m.name),
                                   workload_window(m.events, m.requests))
            for m in run.modes}


def fidelity_of(run: RunData) -> dict:
    """summary.json's ``fidelity``: per mode and for the run (testbed.report.fidelity)."""
    topology = run.metadata.get("topology") or {}
    hosts = fidelity.probe_hosts(topology)
    modes = {}
    for m in run.modes:
        window = workload_window(m.events, m.requests)
        modes[m.name] = fidelity.mode_fidelity(run.path / m.name, m.events, m.links, topology,
                                               window, hosts)
    return fidelity.combine(modes, run.resolved.get("fidelity") or "report")


def exit_code(summary: dict) -> int:
    """0 passed, 1 failed; 2 when the scenario declares ``fidelity: strict`` and the
    run's fidelity is degraded (its figures measure the host, not PDD)."""
    if strict_degraded(summary):
        return 2
    return 0 if summary["passed"] else 1


def strict_degraded(summary: dict) -> bool:
    fid = summary.get("fidelity") or {}
    return fid.get("policy") == "strict" and fid.get("verdict") == fidelity.DEGRADED


def summary_json(summary: dict) -> str:
    """Strict JSON (no NaN), stable formatting so re-running rewrites identical bytes."""
    return json.dumps(summary, indent=2, allow_nan=False) + "\n"


TABLE_METRICS = ("requests_completed", "requests_failed", "tokens_lost", "tokens_duplicated",
                 "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_ms", "e2e_p99_s",
                 "goodput_rps", "handoff_stall_p99_ms", "wan_bytes", "intra_dc_bytes",
                 "rld_token_share", "relayed_share")


def summary_table(summary: dict) -> str:
    """The per-mode metrics and expectation results as plain text (CLI output)."""
    modes = list(summary["modes"])
    lines = [f"scenario {summary['scenario']}  backend {summary['backend']}  k={summary['scale']:g}"
             "  (bytes nominal = emulated x k)",
             f"{'metric':<22}" + "".join(f"{m:>16}" for m in modes)]
    for name in TABLE_METRICS:
        cells = []
        for m in modes:
            v = summary["modes"][m].get(name)
            cells.append("-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v))
        lines.append(f"{name:<22}" + "".join(f"{c:>16}" for c in cells))
    for e in summary.get("expectations", []):
        lines.append(f"{'PASS' if e['passed'] else 'FAIL'}  {e['name']}: {e['value']} "
                      f"(bound {e['bound']})")
    lines.append("passed" if summary["passed"] else "FAILED")
    lines += [f"  because {why}" for why in summary.get("failures", [])]
    fid = summary.get("fidelity") or {}
    lines.append("fidelity: none to judge (virtual clock: simulated time, no host to keep up)"
                 if summary.get("clock") == "virtual" else
                 f"fidelity {fid.get('verdict') or 'not measured'}"
                 + (" (strict: exit 2)" if strict_degraded(summary) else ""))
    lines += [f"  because {why}" for why in fid.get("reasons", [])]
    note = fidelity.steal_line(fid)
    lines += [f"  note: {note}"] if note else []
    return "\n".join(lines)
