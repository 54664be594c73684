"""The router over a fleet (several P, RLD and MD instances): which instance a request gets,
and the one WAN capacity sample of every MD's status."""

from __future__ import annotations

import time

from testbed.pdd.roles.router import RouterNode
from testbed.pdd.run.config import parse_config
from testbed.pdd.wire.protocol import Role
from testbed.pdd.wire.status import WanStatus

FLEET = [("router", "router", "A"), ("p0", "prefill", "A"), ("p1", "prefill", "A"),
         ("rld0", "relay_decode", "A"), ("rld1", "relay_decode", "A"),
         ("md0", "main_decode", "B"), ("md1", "main_decode", "B"), ("client", "client", "B")]


def fleet_router(token_scale: int = 1) -> RouterNode:
    instances = [{"name": n, "role": r, "host": "127.0.0.1", "dc": dc,
                  **({} if r == "client" else {"port": 7000 + i})}
                 for i, (n, r, dc) in enumerate(FLEET)]
    cfg = parse_config({"mode": "pdd", "timing": {"token_scale": token_scale}, "instances": instances},
                       "<test>")
    return RouterNode(cfg, "router", transport=None)


def prompt(seed: int, n: int = 256) -> list[int]:
    return [(seed * 7919 + i * 31) % 500 for i in range(n)]


def test_a_prompt_goes_to_the_p_whose_prefill_would_end_first():
    # 256 real tokens x 256 = a 64K-token prompt: ~8 s of cold prefill on a 4-chip
    # GPU-A instance, a few tens of ms when P's cache holds all but 3 tokens
    router = fleet_router(token_scale=256)
    cold = router.cfg.timing.cost(Role.PREFILL).prefill_s(259, 0)  # real tokens x token_scale
    assert 6.0 < cold < 10.0
    a, b = prompt(1), prompt(2)
    router._p_mirror("p1").record(a)
    router.p_free_at["p1"] = time.monotonic() + cold - 2.0  # busy, but less than a cold prefill
    assert router._choose(a + [1, 2, 3])[Role.PREFILL] == "p1"  # its hit outweighs the queue
    assert router._choose(b)[Role.PREFILL] == "p0"  # no hit anywhere: the free one
    router.p_free_at["p1"] = time.monotonic() + cold + 2.0  # the queue outweighs the hit
    assert router._choose(a + [1, 2, 3])[Role.PREFILL] == "p0"
    router.p_free_at["p0"] = time.monotonic() + 20.0
    assert router._choose(b)[Role.PREFILL] == "p1"


def test_free_ps_without_hits_go_by_name_and_a_partial_hit_wins_among_free_ones():
    router = fleet_router(token_scale=256)
    a = prompt(1)
    assert router._choose(a)[Role.PREFILL] == "p0"
    router._p_mirror("p1").record(a[:128])  # half the prompt: half the prefill
    assert router._choose(a)[Role.PREFILL] == "p1"


def test_a_prompt_goes_to_the_md_whose_drc_holds_or_receives_it():
    router = fleet_router()
    a, b, c = prompt(1), prompt(2), prompt(3)
    router._md_mirror("md1").record(a)
    router.md_inflight.add("md0", 99, b, arrival_s=time.monotonic() + 1.0)
    chosen = router._choose(a)
    assert chosen[Role.MAIN_DECODE] == "md1"
    assert router._choose(b)[Role.MAIN_DECODE] == "md0"  # its KV is on the way to md0
    assert router._choose(c)[Role.MAIN_DECODE] == "md0"  # a tie: by name


def test_dead_instances_are_not_chosen_and_none_live_gives_none():
    router = fleet_router()
    router.dead |= {"p0", "rld0", "rld1"}
    chosen = router._choose(prompt(1))
    assert chosen[Role.PREFILL] == "p1"
    assert chosen[Role.RELAY_DECODE] is None
    assert chosen[Role.MAIN_DECODE] in {"md0", "md1"}


def test_the_least_active_rld_takes_the_next_relay():
    router = fleet_router()
    router.rld_active.update(rld0=3, rld1=1)
    assert router._choose(prompt(1))[Role.RELAY_DECODE] == "rld1"
    router.rld_active["rld1"] = 4
    assert router._choose(prompt(1))[Role.RELAY_DECODE] == "rld0"


def test_the_wan_sample_sums_the_recent_rates_of_every_md():
    router = fleet_router()
    samples: list[tuple[float, float, bool]] = []
    router.wan.add_rate_sample = lambda now, nbytes, interval, busy: samples.append(
        (nbytes, interval, busy))
    k = router.cfg.timing.kv_scale_k
    router._on_wan_status("md0", WanStatus(0.5, 1000, True).data())
    router._on_wan_status("md1", WanStatus(0.5, 3000, False).data())
    # md0 alone: its own 1000 B; then md1's 3000 B plus md0's 1000 B of the same interval
    assert samples[0] == (1000 * k, 0.5, True)
    assert abs(samples[1][0] - 4000 * k) < 1e-6 and samples[1][2] is False
    router.md_rx["md0"] = (time.monotonic() - 5.0, *router.md_rx["md0"][1:])  # md0 went quiet
    router._on_wan_status("md1", WanStatus(0.5, 3000, True).data())
    assert abs(samples[2][0] - 3000 * k) < 1e-6  # a stale status is not summed
