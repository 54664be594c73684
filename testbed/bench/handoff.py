"""``testbed bench handoff``: the 100-token handoff over the emulated WAN.

Owns the benchmark's set-up: the default topology with WAN jitter, N TCP
cross-traffic flows over the WAN, the two endpoints of
``testbed.bench.handoff_bench`` in the MD and RLD hosts, and the statistics
(mean, max, std, p50, p99 per method) of the trials. Nominal figures: the
KV payload is bytes/k on a link of rate/k, so its transfer time is the
nominal one; the recompute is the cost model's GPU_B extend time.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from testbed.net.apply import wait_listening
from testbed.net.build import open_network
from testbed.net.crosstraffic import start_cross_traffic
from testbed.net import runtime
from testbed.spec.topology import Role

PORT = 7300


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"n": len(xs), "mean_ms": statistics.mean(xs), "max_ms": xs[-1],
            "std_ms": statistics.pstdev(xs), "p50_ms": xs[len(xs) // 2],
            "p99_ms": xs[min(len(xs) - 1, int(0.99 * len(xs)))]}


def run_handoff_bench(topo, backend=None, scale=None, trials: int = 30, jitter_ms: float = 2.0,
                      cross_flows: int = 4) -> dict:
    md = topo.hosts_with(Role.MAIN_DECODE)[0]
    rld = topo.hosts_with(Role.RELAY_DECODE)[0]
    out = Path(tempfile.mkdtemp(prefix="handoff-")) / "trials.jsonl"
    with open_network(topo, backend, scale) as net:
        k = net.plan.scale
        runtime.set_link(net, "wan", jitter_ms=jitter_ms)
        net.popen(md.name, [sys.executable, "-m", "testbed.bench.handoff_bench", "server",
                                     "--port", str(PORT), "--out", str(out)],
                           what="handoff bench server")
        wait_listening(net, md.name, PORT, timeout_s=60)
        flows = start_cross_traffic(net, cross_flows) if cross_flows else None
        time.sleep(2)
        r = net.run(rld.name, [sys.executable, "-m", "testbed.bench.handoff_bench", "client",
                               "--host", md.ip, "--port", str(PORT), "--trials", str(trials),
                               "--scale", str(k)], timeout=600)
        if flows:
            flows.stop()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    out.unlink()
    out.parent.rmdir()
    by = {m: [r["handoff_ms"] for r in rows if r["method"] == m] for m in ("kv", "ids")}
    wan = topo.wan.a_to_b
    return {"topology": topo.name, "backend": net.plan.backend.value, "scale": k,
            "wan": {"rate_gbit": wan.rate_gbit, "rtt_ms": topo.wan.rtt_ms, "jitter_ms": jitter_ms,
                    "cross_flows": cross_flows},
            "tokens": 100, "kv_bytes_nominal": rows[0]["bytes"] * k if rows else None,
            "client_exit": r.returncode, "incremental_kv": _stats(by["kv"]),
            "token_ids_recompute": _stats(by["ids"])}
