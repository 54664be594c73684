"""Watch a live deployment while a load runs: the gateway's /health latency and every
role process's memory.

``python -m testbed.bench.health_probe BASE_URL OUT.jsonl [--interval-s 0.1]`` asks
``BASE_URL/health`` every ``interval_s`` (one request at a time, 5 s timeout) and
reads the resident memory (VmRSS) of every process whose command line runs a testbed
role or the gateway (``testbed.pdd.run.node CONFIG NAME``, ``testbed.pdd.roles.gateway
CONFIG NAME``: keyed by NAME, the gateway as ``gateway``); each sample is one JSON line
``{"t", "t_mono", "health_ms", "status", "connect_ms", "late_ms", "rss_mb": {name: MB}}``
(``t``: seconds since the probe started, at the answer; ``t_mono``: the machine's monotonic
clock when it asked, the clock of the roles' and the gateway's stats files):
``connect_ms`` until the TCP connection was up (the kernels do that alone, before the
server is involved), ``late_ms`` how much later than its schedule the probe itself
woke to ask (the machine's scheduling pressure on the instrument). On SIGTERM or
SIGINT it stops and prints a summary (JSON): samples, health latency p50/p99/max, how
many answers were not 200 or took over 100 ms and of those how many had a connect over
50 ms, the probe's own lateness p99/max, each process's peak RSS and its RSS slope (MB
per minute, least squares). ``--rt-priority 1`` runs the probe at the gateway's
priority (SCHED_RR 1, root), so that a benchmark client's processes on the same cores
delay the probe no more than the gateway. Run it beside a benchmark client inside a
``testbed serve`` (docs/robustness.md, "Overload"):

    testbed serve topologies/two-dc.yaml --mode pdd --out runs/overload -- sh -c \\
      '.venv/bin/python -m testbed.bench.health_probe {url} {out}/health.jsonl & \\
       .venv-bench/bin/aiperf profile ...; rc=$?; kill $!; wait; exit $rc'
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import time
import urllib.parse
from pathlib import Path

from testbed.histogram import percentile, slope_per_min
from testbed.pdd.run.probe import rss_mb

_MODULES = {"testbed.pdd.run.node": None, "testbed.pdd.roles.gateway": "gateway"}


def role_processes() -> dict[str, int]:
    """Every testbed role or gateway process on this machine: its instance name -> pid."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        for module, fixed in _MODULES.items():
            if module in args:
                i = args.index(module)
                name = fixed or (args[i + 2] if len(args) > i + 2 else f"pid{pid}")
                out[name] = int(pid)
    return out


def probe_health(url: str) -> tuple[float, int | str, float | None]:
    """One GET on a fresh connection: (ms in all, status or the error's name, ms until the
    TCP connection was up). The connection is made by the kernels alone (SYN, SYN-ACK,
    ACK: the server process is not involved until it accepts), so a slow connect is the
    machine's packet processing, and the rest of the time is the server's and the
    answer's way back."""
    parts = urllib.parse.urlsplit(url)
    t = time.monotonic()
    connect_ms = None
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=5)
    try:
        conn.connect()
        connect_ms = round((time.monotonic() - t) * 1e3, 2)
        conn.request("GET", parts.path or "/")
        resp = conn.getresponse()
        resp.read()
        status: int | str = resp.status
    except (OSError, ValueError, http.client.HTTPException) as err:
        status = type(err).__name__
    finally:
        conn.close()
    return round((time.monotonic() - t) * 1e3, 2), status, connect_ms


def summarize(samples: list[dict]) -> dict:
    lat = [s["health_ms"] for s in samples]
    late = [s["late_ms"] for s in samples if s.get("late_ms") is not None]
    slow = [s for s in samples if s["health_ms"] > 100]
    series: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for name, mb in s["rss_mb"].items():
            if mb is not None:
                series.setdefault(name, []).append((s["t"], mb))
    return {"samples": len(samples),
            "health_ms": {"p50": percentile(lat, 50), "p99": percentile(lat, 99),
                          "max": max(lat, default=None)},
            "health_not_200": sum(1 for s in samples if s["status"] != 200),
            "health_over_100ms": len(slow),
            # of those, how many were slow before the server was involved (the connect)
            "health_over_100ms_connect_over_50ms": sum(
                1 for s in slow if (s.get("connect_ms") or 0) > 50),
            "probe_late_ms": {"p99": percentile(late, 99), "max": max(late, default=None)},
            "rss_peak_mb": {n: max(v for _, v in pts) for n, pts in sorted(series.items())},
            "rss_slope_mb_per_min": {n: slope_per_min(pts) for n, pts in sorted(series.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.bench.health_probe",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("base_url", help="the gateway's base URL, e.g. http://10.0.0.1:8000")
    ap.add_argument("out", help="JSONL file of samples")
    ap.add_argument("--interval-s", type=float, default=0.1)
    ap.add_argument("--nice", type=int, default=0, help="add this to the probe's nice value "
                    "(negative needs root)")
    ap.add_argument("--rt-priority", type=int, default=0,
                    help="run the probe under SCHED_RR at this priority (root; 1 is the "
                    "gateway's: testbed.pdd.run.sched.FRONT_END_RT_PRIORITY)")
    args = ap.parse_args(argv)
    try:
        if args.nice:
            os.nice(args.nice)
        if args.rt_priority:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(args.rt_priority))
    except OSError as err:
        print(f"error: --nice {args.nice} / --rt-priority {args.rt_priority}: {err.strerror}",
              file=sys.stderr)
        return 2
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    url, samples, t0 = args.base_url.rstrip("/") + "/health", [], time.monotonic()
    procs, procs_at = role_processes(), time.monotonic()
    due = time.monotonic()
    with open(args.out, "w") as out:
        while not stop:
            asked = time.monotonic()
            late_ms = round(max(0.0, asked - due) * 1e3, 2)
            ms, status, connect_ms = probe_health(url)
            s = {"t": round(time.monotonic() - t0, 3), "t_mono": round(asked, 4),
                 "health_ms": ms, "status": status,
                 "connect_ms": connect_ms, "late_ms": late_ms,
                 "rss_mb": {n: rss_mb(pid) for n, pid in sorted(procs.items())}}
            samples.append(s)
            out.write(json.dumps(s) + "\n")
            out.flush()
            if time.monotonic() - procs_at > 5:  # a restarted role has a new pid
                procs, procs_at = role_processes(), time.monotonic()
            due = max(due + args.interval_s, time.monotonic())  # no burst after a stall
            time.sleep(max(0.0, due - time.monotonic()))
    print(json.dumps(summarize(samples), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
