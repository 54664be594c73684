"""P's layer-wise local path: when each chunk may leave, and token 0 never before the prefill ends."""

from __future__ import annotations

import pytest
from pdd_fixtures import run, run_on_fake_wan, small_config, workload

from testbed.pdd.roles.prefill import PrefillJob, PrefillNode
from testbed.pdd.wire.protocol import Request


def job(n: int, hit: int) -> PrefillJob:
    j = PrefillJob(1, Request(tuple(range(n)), 4, {"pipeline": "p-rld-md"}), 0.0)
    j.t_start, j.t_end_est, j.hit = 10.0, 12.0, hit
    return j


@pytest.mark.parametrize("n, hit, end, expected", [
    (100, 40, 40, 10.0),    # the cached prefix is there at once
    (100, 40, 16, 10.0),
    (100, 40, 70, 11.0),    # half the new tokens: half the prefill
    (100, 40, 100, 12.0),   # the last chunk: the prefill's end
    (100, 100, 100, 10.0),  # everything cached
    (100, 0, 25, 10.5),
])
def test_release_time_follows_the_prefill(n, hit, end, expected):
    assert PrefillNode._release_s(job(n, hit), end) == pytest.approx(expected)


@pytest.mark.parametrize("layerwise", [True, False])
def test_rld_emits_token_0_only_after_the_prefill_ended(layerwise):
    cfg = small_config("pdd", prefill={"layerwise_local": layerwise})
    records, _ = run(run_on_fake_wan(cfg, workload()))
    relayed = [r for r in records if r["pipeline"] in ("p-rld-md", "rld-only")]
    assert relayed and all(r["status"] == "completed" for r in records)
    for r in relayed:
        p, rld = r["reports"]["P"], r["reports"]["RLD"]
        assert rld["t_first_token"] >= p["t_prefill_end"]
