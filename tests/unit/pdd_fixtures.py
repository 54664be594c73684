"""Shared set-up of the PDD role tests: a small cluster config, a workload, a fake-WAN run.

Sizes keep a whole cluster run near one second on two cores: tiny model
(d_model 64, 2 layers, float64), prompts of 20-150 tokens, 30-100 output
tokens, modeled compute at half speed (time_scale 0.5: a GPU_A decode step
is ~9 ms), KV at 50 KB/token / k=10 = 5 KB/token on the wire, and a WAN of
50 ms one way, +-5 ms uniform jitter, 0.08 Gbit/s = 10 MB/s (emulated; 0.8
Gbit/s nominal). A 128-token prompt's KV (640 KB) then takes ~65 ms to serialise
plus ~150 ms of latency (REQUEST, KV_NEED, chunks) to reach MD. Prompts are
short so that real compute on the shared event loop stays small next to
the modeled times.
"""

from __future__ import annotations

import asyncio
import random

from testbed.impairment import LinkSpec
from testbed.pdd.roles.client_record import ClientRequest
from testbed.pdd.run.cluster import start_cluster
from testbed.pdd.run.config import ClusterConfig, one_of_each, parse_config
from testbed.pdd.wire.fake_wan import wan_network

WAN = LinkSpec(rate_gbit=0.08, delay_ms=50, jitter_ms=5, jitter_distribution="uniform")


PORTS = {"router": 7000, "p0": 7001, "rld0": 7002, "md0": 7003}


def small_config(mode: str = "pdd", handoff_mode: str = "catch-up", **sections) -> ClusterConfig:
    obj = {
        "mode": mode,
        "model": {"d_model": 64, "n_layer": 2, "n_head": 2},
        # token_scale 1: these tests size KV and thresholds for the tiny model itself
        "timing": {"time_scale": 0.5, "kv_scale_k": 10, "token_scale": 1, "connect_timeout_s": 2.0},
        "relay": {"handoff_mode": handoff_mode, "catchup_threshold_tokens": 16},
        # predicted WAN time = bytes / rate + 1.5 RTT (REQUEST, KV_NEED, last chunk) + the
        # learned overhead (~10-20 ms here): 128 missing tokens: 64 + 150 ms >= 190 ms ->
        # relay; 10 or 20 missing with nothing ahead -> p-md (behind a 64-token chunk of each
        # transfer under way it would wait ~80 ms per chunk: wan_model.rr_finish_s)
        "router": {"relay_threshold_s": 0.19, "wan_prior_gbit": 0.8, "wan_rtt_s": 0.1,
                   "anomalous_min_input_tokens": 140},
        "client": {"request_timeout_s": 20.0, "report_grace_s": 1.0},
        "instances": one_of_each(host=lambda name: name, port=PORTS.get),
    }
    for key, value in sections.items():
        obj[key] = {**obj.get(key, {}), **value}
    return parse_config(obj, "<test>")


def workload(seed: int = 1) -> list[ClientRequest]:
    """Five requests covering every pipeline of ``pdd`` mode (see EXPECTED)."""
    rng = random.Random(seed)

    def fresh(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(512) for _ in range(n))

    base = fresh(128)
    return [
        ClientRequest(0, 0.00, base, 100, "s1"),  # low hit: relay
        ClientRequest(1, 0.05, fresh(110), 100, "s2"),  # low hit: relay
        ClientRequest(2, 0.70, base + fresh(10), 60, "s1"),  # next turn: 93% hit at P and MD
        ClientRequest(3, 0.10, fresh(150), 40, "s3"),  # long input, short output: anomalous
        ClientRequest(4, 0.90, fresh(20), 30, "s4"),  # short, nothing ahead on the WAN: p-md
    ]


EXPECTED = {  # pipeline of each workload() request per mode
    "pdd": ["p-rld-md", "p-rld-md", "p-md", "rld-only", "p-md"],
    "cross-dc-pd": ["p-md"] * 5,
    "same-dc-pd": ["rld-only"] * 5,
    # request 2's prefix went rld-only with request 0, so MD lacks it: the
    # whole prompt would cross the WAN, and p-rld keeps it on RLD too
    "p-rld": ["rld-only", "rld-only", "rld-only", "rld-only", "p-md"],
}


async def run_on_fake_wan(cfg: ClusterConfig, requests, events=(), wan: LinkSpec = WAN):
    """Run ``requests`` on a fake two-DC network; ``events`` are (at_s, async fn(handles))."""
    net = wan_network(cfg, wan, seed=7)
    handles = await start_cluster(cfg, lambda inst: net.host(inst.host))

    async def fire(at_s, action):
        await asyncio.sleep(at_s)
        await action(handles)

    try:
        tasks = [asyncio.ensure_future(fire(at, fn)) for at, fn in events]
        records = await handles.run_client(requests)
        await asyncio.gather(*tasks)
        return records, handles
    finally:
        await handles.stop()


def run(coro, timeout_s: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def producers(record) -> list[str]:
    return [t[3] for t in record["tokens"]]


def complete_lines(path) -> list[str]:
    """The lines of a file the gateway may be writing, without a last one it has not
    finished (a record of a few KB can reach the file in more than one write)."""
    return (path.read_text() if path.exists() else "").split("\n")[:-1]
