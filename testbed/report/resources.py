"""What each role process held over a run: memory, descriptors and event-loop lag in time.

Owns ``instance_resources`` (one instance's figures), ``mode_resources`` (every
instance of a mode and the two figures a scenario may bound) and
``lag_by_minute``. Input is plain data: the snapshots a role appends to
``MODE/roles/NAME.stats.jsonl`` every second (testbed/pdd/run/probe.py:
``rss_mb`` and ``fds`` are gauges, ``loop_lag`` a cumulative histogram) and
the workload window. Nothing here reads files.

Definitions (docs/run-directory.md, "resources"):

- the figures are those of the instance's *last* process (a restarted
  instance appends under a new pid; a slope across a restart would measure
  the restart); ``processes`` says how many there were;
- ``rss_slope_mb_per_min`` / ``fd_slope_per_min``: the least-squares slope
  of the gauge over the second half of the workload window, per minute.
  The first half is left out on purpose: caches fill (P's prefix cache, the
  DRC, the allocator's arenas) until they reach their bounds, and a healthy
  process grows then; a leak keeps growing in the second half. The slope
  over the whole window is kept beside it (``rss_slope_all_mb_per_min``);
- ``loop_lag_p99_ms_by_min``: the event loop's lag p99 in each whole minute
  of the window (the difference of the cumulative histograms at its ends),
  so a loop that slows as state accumulates shows a rising list;
- the mode's ``rss_slope_max_mb_per_min`` and ``fd_slope_max_per_min``: the
  largest of the serving instances' slopes (router, P, RLD, MD). The client
  is the load generator: it keeps every request's record until it writes
  requests.jsonl at the end, so it grows by design; its figures are shown,
  not judged.

Example::

    figs = mode_resources({"p1": rows_p1, "client": rows_c}, window=(t0, t1))
    figs["rss_slope_max_mb_per_min"], figs["instances"]["p1"]["fds_peak"]
"""

from __future__ import annotations

from typing import Mapping, Sequence

from testbed.histogram import difference, quantile_ms, slope_per_min

NOT_JUDGED_ROLES = ("client",)
LAG_WINDOW_S = 60.0


def _last_process(rows: Sequence[Mapping]) -> tuple[list[Mapping], int]:
    pids: dict[object, list[Mapping]] = {}
    for r in sorted(rows, key=lambda r: r["t_mono"]):
        pids.setdefault(r.get("pid"), []).append(r)
    if not pids:
        return [], 0
    last = max(pids.values(), key=lambda rs: rs[-1]["t_mono"])
    return last, len(pids)


def _series(rows: Sequence[Mapping], key: str, lo: float, hi: float) -> list[tuple[float, float]]:
    return [(r["t_mono"], float(r[key])) for r in rows
            if r.get(key) is not None and lo <= r["t_mono"] <= hi]


def lag_by_minute(rows: Sequence[Mapping], lo: float, hi: float,
                  width_s: float = LAG_WINDOW_S) -> list[float | None]:
    """The loop lag p99 (ms) of each whole ``width_s`` of [lo, hi], from cumulative
    snapshots of one process sorted by time (None for a minute with no wake-up)."""
    out: list[float | None] = []
    snaps = [r for r in rows if r.get("loop_lag")]
    start = lo
    while start + width_s <= hi + 1e-9:
        a = next((r for r in reversed(snaps) if r["t_mono"] <= start), None)
        b = next((r for r in snaps if r["t_mono"] >= start + width_s), None)
        if a is None or b is None:
            out.append(None)
        else:
            d = difference(b["loop_lag"], a["loop_lag"])
            out.append(quantile_ms(d, 0.99) if d["n"] else None)
        start += width_s
    return out


def instance_resources(rows: Sequence[Mapping], window: tuple[float, float] | None) -> dict | None:
    """One instance's resource figures over ``window`` (None: all its snapshots); None
    when its snapshots carry no gauges (runs made before the probe read them)."""
    last, processes = _last_process(rows)
    if not last or all(r.get("rss_mb") is None for r in last):
        return None
    lo, hi = window if window is not None else (last[0]["t_mono"], last[-1]["t_mono"])
    lo = max(lo, last[0]["t_mono"])  # a restarted process starts inside the window
    mid = lo + (hi - lo) / 2
    rss_all, fds_all = _series(last, "rss_mb", lo, hi), _series(last, "fds", lo, hi)
    if not rss_all:
        return None
    fds = [v for _, v in fds_all]
    return {
        "role": last[-1].get("role"), "processes": processes, "samples": len(rss_all),
        "minutes": round((hi - lo) / 60.0, 2),
        "rss_first_mb": rss_all[0][1], "rss_last_mb": rss_all[-1][1],
        "rss_peak_mb": max(v for _, v in rss_all),
        "rss_slope_mb_per_min": slope_per_min(_series(last, "rss_mb", mid, hi)),
        "rss_slope_all_mb_per_min": slope_per_min(rss_all),
        "fds_first": int(fds[0]) if fds else None, "fds_last": int(fds[-1]) if fds else None,
        "fds_peak": int(max(fds)) if fds else None,
        "fd_slope_per_min": slope_per_min(_series(last, "fds", mid, hi)),
        "loop_lag_p99_ms_by_min": lag_by_minute(last, lo, hi),
    }


def mode_resources(stats: Mapping[str, Sequence[Mapping]],
                   window: tuple[float, float] | None) -> dict:
    """{"instances": {name: figures}, "rss_slope_max_mb_per_min", "fd_slope_max_per_min",
    and the instance each came from} of one mode's ``stats`` (instance name -> its
    snapshots)."""
    inst = {name: f for name, rows in sorted(stats.items())
            if (f := instance_resources(rows, window)) is not None}
    out: dict = {"instances": inst}
    for key, figure, which in (
            ("rss_slope_max_mb_per_min", "rss_slope_mb_per_min", "rss_slope_max_instance"),
            ("fd_slope_max_per_min", "fd_slope_per_min", "fd_slope_max_instance")):
        judged = [(f[figure], n) for n, f in inst.items()
                  if f["role"] not in NOT_JUDGED_ROLES and f[figure] is not None]
        out[key], out[which] = max(judged) if judged else (None, None)
    return out
