"""Router decisions (testbed.pdd.roles.routing): the pipeline table, RLD's budget, prefix mirror."""

from __future__ import annotations

import pytest

from testbed.pdd.run.config import RouterConfig, TimingConfig

from testbed.types import Mode, Pipeline
from testbed.pdd.compute.costmodel import GPU_A, CostModel
from testbed.pdd.compute.radix import RadixCache
from testbed.pdd.roles.routing import PrefixMirror, RldBudget, RouteInputs, choose_pipeline

CFG = RouterConfig(relay_threshold_s=0.5, anomalous_min_input_tokens=32768)
TIMING = TimingConfig(kv_bytes_per_token=50_000, token_scale=1)  # prompts below are modeled tokens
FULL = "RLD full: batch 8 of 8"

TABLE = [
    # mode, prompt, max_out, predicted WAN s, RLD decode s, RLD room, filter -> pipeline, reason
    (Mode.PDD, 16384, 1000, 0.2, 15.0, None, True, Pipeline.P_MD, "short"),
    (Mode.PDD, 16384, 1000, 0.8, 15.0, None, True, Pipeline.P_RLD_MD, "relay"),
    (Mode.PDD, 16384, 1000, 0.8, 15.0, FULL, True, Pipeline.P_MD, "RLD full"),
    (Mode.PDD, 16384, 1000, 0.2, 15.0, FULL, True, Pipeline.P_MD, "short"),
    # the KV would arrive after RLD's last token: it does not cross the WAN
    (Mode.PDD, 16384, 100, 3.0, 1.5, None, True, Pipeline.RLD_ONLY, "after RLD's last token"),
    (Mode.PDD, 16384, 100, 3.0, 1.5, FULL, True, Pipeline.P_MD, "RLD full"),
    (Mode.PDD, 40000, 100, 0.1, 1.5, None, True, Pipeline.RLD_ONLY, "anomalous"),  # filter
    (Mode.PDD, 40000, 100, 0.1, 1.5, FULL, True, Pipeline.P_MD, "anomalous, but RLD full"),
    (Mode.PDD, 40000, 100, 0.8, 1.5, None, False, Pipeline.P_RLD_MD, "relay"),  # filter off
    (Mode.PDD, 40000, 500, 0.8, 7.5, None, True, Pipeline.P_RLD_MD, "relay"),  # output not < 500
    (Mode.PDD, 32767, 100, 0.8, 1.5, None, True, Pipeline.P_RLD_MD, "relay"),  # input too short
    (Mode.CROSS_DC_PD, 16384, 1000, 5.0, 15.0, None, True, Pipeline.P_MD, "baseline"),
    (Mode.CROSS_DC_PD, 40000, 100, 5.0, 1.5, None, True, Pipeline.P_MD, "baseline"),
    (Mode.SAME_DC_PD, 16384, 1000, 0.1, 15.0, None, True, Pipeline.RLD_ONLY, "baseline"),
    (Mode.P_RLD, 16384, 1000, 0.8, 15.0, FULL, True, Pipeline.RLD_ONLY, "decode on RLD"),
    (Mode.P_RLD, 16384, 1000, 0.2, 15.0, None, True, Pipeline.P_MD, "short"),
    (Mode.P_RLD, 40000, 100, 0.1, 1.5, FULL, True, Pipeline.RLD_ONLY, "anomalous"),
]


@pytest.mark.parametrize("mode, prompt, max_out, wan_s, rld_s, room, filt, want, why", TABLE)
def test_pipeline_decision_table(mode, prompt, max_out, wan_s, rld_s, room, filt, want, why):
    cfg = RouterConfig(**{**CFG.__dict__, "anomalous_filter": filt})
    d = choose_pipeline(mode, cfg, TIMING, RouteInputs(prompt, max_out, wan_s, rld_s, room))
    assert d.pipeline == want and why in d.reason


def test_rld_budget_comes_from_the_cost_model():
    cost = CostModel(GPU_A, token_scale=32)
    b = RldBudget.of(cost, RouterConfig(rld_step_budget_ms=50.0), 2048)
    # the batch whose step stays within 50 ms, and no more
    assert cost.decode_step_s(b.max_batch, b.max_batch * 2048) <= 0.05
    assert cost.decode_step_s(b.max_batch + 1, (b.max_batch + 1) * 2048) > 0.05
    # 4 x 80 GB x 0.9 minus 140 GB of weights, 50 KB per token
    assert b.kv_tokens == int((4 * 80e9 * 0.9 - 140e9) / 50_000)
    assert RldBudget.of(cost, RouterConfig(rld_max_active=3), 2048).max_batch == 3


def test_rld_room_says_which_limit_binds():
    b = RldBudget(max_batch=4, kv_tokens=100_000)
    assert b.room(3, 0, 50_000) is None
    assert "batch 4 of 4" in b.room(4, 0, 10)
    assert "KV" in b.room(1, 60_000, 50_000)


def test_prefix_mirror_predicts_the_hit_of_p_cache_fed_the_same_prompts():
    mirror, p_cache = PrefixMirror(4, 16), RadixCache(4, 16)
    prompts = [list(range(10)), list(range(12)) + [99], [5] * 9, list(range(8)), [7] * 20]
    for prompt in prompts:  # P does match then insert, in routing (FIFO) order
        expected = mirror.route(prompt)
        assert expected == p_cache.match(prompt).n_tokens
        p_cache.insert(prompt)


def test_a_mirror_can_be_asked_without_recording():
    m = PrefixMirror(16, 1024)
    prompt = tuple(range(64))
    assert m.hit(prompt) == 0 and m.hit(prompt) == 0  # asking does not insert
    m.record(prompt)
    assert m.hit(prompt + (1, 2)) == 64


def test_the_late_kv_rule_uses_its_own_recovering_prediction():
    """loss.yaml, 2026-12-02 (commit 72ba382): a held ~0 Gbit/s estimate predicted 832 s,
    the request went rld-only, and nothing crossed to correct the estimate. The late-KV
    test reads ``late_wan_s`` (the estimate returning toward the line); the threshold
    test keeps ``wan_s``."""
    stale = RouteInputs(16384, 100, 832.0, 1.5, None, late_wan_s=0.9)
    d = choose_pipeline(Mode.PDD, CFG, TIMING, stale)
    assert d.pipeline == Pipeline.P_RLD_MD and "832.00 s" in d.reason
    still_late = RouteInputs(16384, 100, 832.0, 1.5, None, late_wan_s=2.0)
    d = choose_pipeline(Mode.PDD, CFG, TIMING, still_late)
    assert d.pipeline == Pipeline.RLD_ONLY and "(2.00 s)" in d.reason
    # without it (None) the rule reads wan_s, as before
    assert choose_pipeline(Mode.PDD, CFG, TIMING, RouteInputs(
        16384, 100, 3.0, 1.5, None)).pipeline == Pipeline.RLD_ONLY


def test_late_kv_local_can_be_turned_off():
    cfg = RouterConfig(**{**CFG.__dict__, "late_kv_local": False})
    d = choose_pipeline(Mode.PDD, cfg, TIMING, RouteInputs(16384, 100, 3.0, 1.5, None))
    assert d.pipeline == Pipeline.P_RLD_MD


@pytest.mark.parametrize("mode, want", [(Mode.PDD, Pipeline.P_MD), (Mode.P_RLD, Pipeline.P_MD),
                                        (Mode.CROSS_DC_PD, Pipeline.P_MD),
                                        (Mode.SAME_DC_PD, Pipeline.RLD_ONLY)])
def test_a_warmup_request_goes_p_md_to_fill_the_drc(mode, want):
    """A cold 40K-token system prompt with 16 output tokens would be anomalous (rld-only):
    as a warm-up it crosses, so MD's DRC holds it like P's cache does."""
    d = choose_pipeline(mode, CFG, TIMING, RouteInputs(40000, 16, 3.0, 0.2, None, warmup=True))
    assert d.pipeline == want
    plain = choose_pipeline(Mode.PDD, CFG, TIMING, RouteInputs(40000, 16, 3.0, 0.2, None))
    assert plain.pipeline == Pipeline.RLD_ONLY


def test_inflight_prefixes_give_the_longest_block_aligned_prefix_per_md():
    from testbed.pdd.roles.routing import InflightPrefixes

    inflight = InflightPrefixes(block_size=16)
    turn1 = list(range(100))
    inflight.add("md1", 1, turn1[:40], arrival_s=5.0)
    inflight.add("md1", 2, turn1, arrival_s=9.0)
    inflight.add("md2", 3, turn1, arrival_s=1.0)
    turn2 = turn1 + [7] * 30
    assert inflight.longest("md1", turn2) == (96, 9.0)  # 100 shared -> 6 whole blocks
    assert inflight.longest("md1", turn1[:40] + [999]) == (32, 5.0)  # rid 2 shares 40 too
    assert inflight.longest("md9", turn2) == (0, 0.0) and inflight.longest(None, turn2) == (0, 0.0)
    inflight.remove(2)
    assert inflight.longest("md1", turn2) == (32, 5.0)
    inflight.remove(1)
    assert inflight.longest("md1", turn2) == (0, 0.0) and inflight.longest("md2", turn2)[0] == 96


def test_the_threshold_test_adds_the_margin_of_recent_prediction_errors():
    """0.3 s predicted is p-md; with a 0.3 s margin (recent near-threshold transfers took
    that much longer than predicted) it relays."""
    short = RouteInputs(16384, 1000, 0.3, 15.0, None)
    assert choose_pipeline(Mode.PDD, CFG, TIMING, short).pipeline == Pipeline.P_MD
    d = choose_pipeline(Mode.PDD, CFG, TIMING,
                        RouteInputs(16384, 1000, 0.3, 15.0, None, wan_margin_s=0.3))
    assert d.pipeline == Pipeline.P_RLD_MD
    # late_kv_local compares the best estimate, not the pessimistic one: 1.2 s < 1.5 s relays
    d = choose_pipeline(Mode.PDD, CFG, TIMING,
                        RouteInputs(16384, 100, 1.2, 1.5, None, wan_margin_s=0.5))
    assert d.pipeline == Pipeline.P_RLD_MD


def test_relaying_must_gain_the_threshold_over_the_local_path():
    """RLD has no prefix cache: a high-hit request's whole prompt crosses the local path.
    1.0 s of WAN relays when the local path takes 0.1 s (gain 0.9 s), not when it takes
    0.6 s (gain 0.4 s < 0.5 s); the margin counts on the WAN side only."""
    fast = RouteInputs(16384, 1000, 1.0, 15.0, None, local_s=0.1)
    assert choose_pipeline(Mode.PDD, CFG, TIMING, fast).pipeline == Pipeline.P_RLD_MD
    slow = RouteInputs(16384, 1000, 1.0, 15.0, None, local_s=0.6)
    d = choose_pipeline(Mode.PDD, CFG, TIMING, slow)
    assert d.pipeline == Pipeline.P_MD and "gains 0.40 s" in d.reason
    margin = RouteInputs(16384, 1000, 1.0, 15.0, None, local_s=0.6, wan_margin_s=0.2)
    assert choose_pipeline(Mode.PDD, CFG, TIMING, margin).pipeline == Pipeline.P_RLD_MD
    # p-rld (steps 1-2, then rld-only) weighs the local path too
    assert choose_pipeline(Mode.P_RLD, CFG, TIMING, slow).pipeline == Pipeline.P_MD


LOSSY = 0.05  # 5% of segments retransmitted: above the 1% default threshold


@pytest.mark.parametrize("mode, share, room, want, why", [
    # a short transfer goes p-md on a clean WAN, relays on a lossy one
    (Mode.PDD, 0.0, None, Pipeline.P_MD, "short transfer"),
    (Mode.PDD, 0.009, None, Pipeline.P_MD, "short transfer"),
    (Mode.PDD, 0.01, None, Pipeline.P_RLD_MD, "lossy WAN (1.0% of segments"),
    (Mode.PDD, LOSSY, None, Pipeline.P_RLD_MD, "lossy WAN (5.0% of segments"),
    # RLD's room still binds: the loss does not overload RLD
    (Mode.PDD, LOSSY, FULL, Pipeline.P_MD, "lossy WAN (5.0%"),
    # p-rld: step 2, then all RLD
    (Mode.P_RLD, LOSSY, None, Pipeline.RLD_ONLY, "lossy WAN"),
    # the baselines ignore it
    (Mode.CROSS_DC_PD, LOSSY, None, Pipeline.P_MD, "baseline"),
])
def test_a_lossy_wan_relays_short_transfers(mode, share, room, want, why):
    inp = RouteInputs(16384, 1000, 0.2, 15.0, room, wan_retrans_share=share)
    d = choose_pipeline(mode, CFG, TIMING, inp)
    assert (d.pipeline, d.reason.startswith(why)) == (want, True), d.reason


def test_the_lossy_wan_test_can_be_turned_off_and_its_level_set():
    inp = RouteInputs(16384, 1000, 0.2, 15.0, None, wan_retrans_share=LOSSY)
    off = RouterConfig(relay_threshold_s=0.5, lossy_wan_retrans_pct=0)
    assert choose_pipeline(Mode.PDD, off, TIMING, inp).pipeline == Pipeline.P_MD
    high = RouterConfig(relay_threshold_s=0.5, lossy_wan_retrans_pct=6)
    assert choose_pipeline(Mode.PDD, high, TIMING, inp).pipeline == Pipeline.P_MD


def test_a_lossy_wan_keeps_the_late_kv_rule():
    """A transfer predicted to land after RLD's last token stays rld-only: the loss does
    not make the KV cross when it would not be used."""
    inp = RouteInputs(16384, 1000, 0.2, 0.1, None, wan_retrans_share=LOSSY)
    d = choose_pipeline(Mode.PDD, CFG, TIMING, inp)
    assert d.pipeline == Pipeline.RLD_ONLY, d.reason
