"""MD fetches a prefix over the WAN once: a next turn arriving while the
previous turn's KV is still crossing waits for it and asks only for the rest."""

from __future__ import annotations

import random

from pdd_fixtures import run, run_on_fake_wan, small_config

from testbed.pdd.roles.client_record import ClientRequest
from testbed.pdd.run.verify import verify_records


def turns(first_len: int = 600, extra: int = 20):
    rng = random.Random(5)
    first = tuple(rng.randrange(512) for _ in range(first_len))
    second = first + tuple(rng.randrange(512) for _ in range(extra))
    # the first turn's KV (600 tokens x 5 KB at 10 MB/s: ~0.3 s) is still in
    # flight when the second arrives 50 ms later
    return [ClientRequest(0, 0.0, first, 20, "s"), ClientRequest(1, 0.05, second, 20, "s")]


def test_a_next_turn_waits_for_its_prefix_in_flight_and_fetches_only_the_rest():
    cfg = small_config("cross-dc-pd")
    records, _ = run(run_on_fake_wan(cfg, turns()))
    assert [r["status"] for r in records] == ["completed", "completed"]
    assert all(v.match for v in verify_records(records, cfg.model))
    first, second = (r["reports"]["MD"] for r in records)
    assert second["inflight_wait_for"] >= 1 and second["inflight_shared_tokens"] == 592
    assert second["drc_hit_tokens"] == 592  # 600 // 16 * 16: the first turn's blocks
    per_token = cfg.timing.modeled_kv_bytes(1)
    assert second["kv_wan_bytes"] < 40 * per_token < first["kv_wan_bytes"]
    # the router knew: it expected MD to hold the in-flight prefix
    assert records[1]["reports"]["router"]["inflight_shared_tokens"] == 592


def test_without_a_shared_prefix_nothing_waits():
    cfg = small_config("cross-dc-pd")
    reqs = turns()
    rng = random.Random(9)
    other = ClientRequest(1, 0.05, tuple(rng.randrange(512) for _ in range(40)), 20, "t")
    records, _ = run(run_on_fake_wan(cfg, [reqs[0], other]))
    md = records[1]["reports"]["MD"]
    assert "inflight_wait_for" not in md and md["drc_hit_tokens"] == 0
