"""The report: a run directory in, summary.json + report.md + PNGs out.

Owns ``build_report`` and ``draw_plots``. Reads only the run directory
(docs/run-directory.md) and never imports the network or PDD runtime code,
so a run can be reported on any machine, any number of times: every output
is rewritten from the run's own files, and re-running gives the same bytes.

Modules: ``rundir`` (reading), ``metrics`` (one mode's figures, comparisons),
``expectations`` (the scenario's checks), ``summary`` (summary.json),
``plots`` (PNGs), ``render`` (report.md), ``events`` (fault/link events),
``balance`` (work per instance).

Example::

    summary = build_report("runs/wan-fault")
    summary["passed"], summary["modes"]["pdd"]["ttft_p90_s"]
"""

from __future__ import annotations

from pathlib import Path

from testbed.report.balance import balance
from testbed.report.metrics import completed, named_instances, workload_window
from testbed.report.plots import (Plot, hit_bins, plot_balance, plot_hit_rates,
                                  plot_kv_prediction, plot_relay_timeline, plot_ttft_cdf,
                                  plot_wan_throughput, relayed_examples)
from testbed.report.render import render
from testbed.report.rundir import RunData, load_run
from testbed.report.summary import instances_of, summarize, summary_json

__all__ = ["build_report", "draw_plots"]

PLOT_FILES = {"ttft": "ttft_cdf.png", "wan": "wan_throughput.png",
              "timeline": "relay_timeline.png", "hit": "hit_rates.png",
              "prediction": "kv_prediction.png", "balance": "balance.png"}
TIMELINE_MODE = "pdd"  # preferred mode for the relayed-request timeline


def _timeline_mode(run: RunData) -> str | None:
    names = sorted(run.mode_names, key=lambda n: n != TIMELINE_MODE)
    for name in names:
        if relayed_examples(run.mode(name).requests, 1):
            return name
    return names[0] if names else None


def draw_plots(run: RunData) -> list[Plot]:
    """Write every PNG into the run directory; the Plot list says what was drawn."""
    out = run.path
    plots = [
        plot_ttft_cdf({m.name: [r.get("ttft_s") for r in completed(m.requests)]
                       for m in run.modes}, out / PLOT_FILES["ttft"]),
        plot_wan_throughput({m.name: (m.links, m.events) for m in run.modes}, run.scale,
                            out / PLOT_FILES["wan"]),
    ]
    mode = _timeline_mode(run)
    if mode is not None:
        plots.append(plot_relay_timeline(mode, run.mode(mode).requests,
                                         out / PLOT_FILES["timeline"]))
    plots.append(plot_hit_rates({m.name: [r.get("p_hit_rate") for r in m.requests]
                                 for m in run.modes}, hit_bins(run.resolved),
                                out / PLOT_FILES["hit"]))
    plots.append(plot_kv_prediction({m.name: m.requests for m in run.modes},
                                    out / PLOT_FILES["prediction"]))
    plots.append(plot_balance({m.name: balance(m.requests, instances_of(run, m.name)
                                               or named_instances(m.requests),
                                               workload_window(m.events, m.requests))
                               for m in run.modes}, out / PLOT_FILES["balance"]))
    return plots


def build_report(run_dir: Path | str) -> dict:
    """Write summary.json, report.md and the PNGs into ``run_dir``; return the summary.

    ``summary["passed"]`` is True when every expectation passed and no mode
    lost or duplicated a token. Raises ReportError (not a run directory,
    malformed file) or ExpectationError (an expectation names an unknown
    metric or mode), both TestbedErrors.
    """
    run = load_run(run_dir)
    summary = summarize(run)
    plots = draw_plots(run)
    captures = analyse_captures(run)
    (run.path / "summary.json").write_text(summary_json(summary))
    (run.path / "report.md").write_text(render(run, summary, plots, captures))
    return summary


def analyse_captures(run: RunData) -> dict[str, dict]:
    """Each mode's ``MODE/wan.pcap`` (``--pcap``) analysed into ``MODE/pcap.json``:
    {mode: figures}; modes without a capture are left out."""
    import json

    from testbed.report.metrics import emulated_bytes, link_bytes
    from testbed.report.pcap import mode_capture_report

    topo = run.metadata.get("topology") or {}
    subnets = {d["name"]: d["subnet"] for d in topo.get("datacenters") or ()
               if d.get("subnet")}
    out = {}
    for m in run.modes:
        path = run.path / m.name / "wan.pcap"
        if not path.is_file() or len(subnets) < 2:
            continue
        roles = emulated_bytes(m.requests)["wan_bytes"]
        link = link_bytes(m.links, "wan").get("a>b")
        out[m.name] = mode_capture_report(path, subnets, roles, link)
        (run.path / m.name / "pcap.json").write_text(json.dumps(out[m.name], indent=1) + "\n")
    return out
