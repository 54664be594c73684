"""Router decisions (testbed.pdd.routing): the pipeline table, WAN estimate, prefix mirror."""

from __future__ import annotations

import pytest

from testbed.pdd.config import Mode, Pipeline, RouterConfig, TimingConfig
from testbed.pdd.radix import RadixCache
from testbed.pdd.routing import (PrefixMirror, RouteInputs, WanEstimate, choose_pipeline,
                                 expected_wan_s)

# 50 KB/token nominal; WAN 10 Gbit/s; RTT 0.1 s; threshold 0.5 s:
# 4096 missing tokens = 204.8 MB = 0.164 s + 0.1 -> 0.26 s (p-md),
# 16384 missing = 0.655 s + 0.1 -> 0.76 s (relay).
CFG = RouterConfig(relay_threshold_s=0.5, rld_max_active=8, anomalous_min_input_tokens=32768,
                   wan_prior_gbit=10.0, wan_rtt_s=0.1)
TIMING = TimingConfig(kv_bytes_per_token=50_000)

TABLE = [
    # mode, prompt, max_out, P hit, RLD active, WAN Gbit/s, filter -> pipeline, reason contains
    (Mode.PDD, 16384, 1000, 16000, 0, 10.0, True, Pipeline.P_MD, "short"),  # high hit
    (Mode.PDD, 16384, 1000, 0, 0, 10.0, True, Pipeline.P_RLD_MD, "relay"),  # low hit
    (Mode.PDD, 16384, 1000, 12288, 0, 10.0, True, Pipeline.P_MD, "short"),  # 75% hit: 0.26 s
    (Mode.PDD, 16384, 1000, 12288, 0, 2.0, True, Pipeline.P_RLD_MD, "relay"),  # slow WAN
    (Mode.PDD, 16384, 1000, 0, 100, 100.0, True, Pipeline.P_MD, "short"),  # fast WAN
    (Mode.PDD, 16384, 1000, 0, 8, 10.0, True, Pipeline.P_MD, "RLD full"),  # RLD at its max
    (Mode.PDD, 16384, 1000, 0, 7, 10.0, True, Pipeline.P_RLD_MD, "relay"),
    (Mode.PDD, 40000, 100, 39000, 0, 10.0, True, Pipeline.RLD_ONLY, "anomalous"),  # filter
    (Mode.PDD, 40000, 100, 0, 0, 10.0, False, Pipeline.P_RLD_MD, "relay"),  # filter off
    (Mode.PDD, 40000, 500, 0, 0, 10.0, True, Pipeline.P_RLD_MD, "relay"),  # output not < 500
    (Mode.PDD, 32767, 100, 0, 0, 10.0, True, Pipeline.P_RLD_MD, "relay"),  # input too short
    (Mode.CROSS_DC_PD, 16384, 1000, 0, 0, 10.0, True, Pipeline.P_MD, "baseline"),
    (Mode.CROSS_DC_PD, 40000, 100, 0, 0, 10.0, True, Pipeline.P_MD, "baseline"),
    (Mode.SAME_DC_PD, 16384, 1000, 16000, 0, 10.0, True, Pipeline.RLD_ONLY, "baseline"),
    (Mode.P_RLD, 16384, 1000, 0, 100, 10.0, True, Pipeline.RLD_ONLY, "decode on RLD"),  # no guard
    (Mode.P_RLD, 16384, 1000, 16000, 0, 10.0, True, Pipeline.P_MD, "short"),
    (Mode.P_RLD, 40000, 100, 0, 0, 10.0, True, Pipeline.RLD_ONLY, "anomalous"),
]


@pytest.mark.parametrize("mode, prompt, max_out, hit, active, gbit, filt, want, why", TABLE)
def test_pipeline_decision_table(mode, prompt, max_out, hit, active, gbit, filt, want, why):
    cfg = RouterConfig(**{**CFG.__dict__, "anomalous_filter": filt})
    d = choose_pipeline(mode, cfg, TIMING, RouteInputs(prompt, max_out, hit, active), gbit)
    assert d.pipeline == want and why in d.reason


def test_expected_wan_time_is_missing_bytes_over_rate_plus_rtt():
    assert expected_wan_s(4096, TIMING, 10.0, 0.1) == pytest.approx(4096 * 50_000 * 8 / 10e9 + 0.1)


def test_wan_estimate_uses_the_prior_until_a_usable_report_then_ewma():
    est = WanEstimate(RouterConfig(wan_prior_gbit=10.0, wan_rtt_s=0.1, wan_ewma_alpha=0.5,
                                   wan_sample_min_bytes=1000), kv_scale_k=10.0)
    assert est.gbit == 10.0
    assert not est.add(500, 1.0)  # too small to say anything about the rate
    assert not est.add(10_000, 0.05)  # shorter than one RTT
    # 2.5 MB on the wire = 25 MB nominal in 0.1 s of serialisation -> 2 Gbit/s
    assert est.add(2_500_000, 0.2) and est.gbit == pytest.approx(2.0)
    assert est.add(5_000_000, 0.2) and est.gbit == pytest.approx(0.5 * 4.0 + 0.5 * 2.0)


def test_prefix_mirror_predicts_the_hit_of_p_cache_fed_the_same_prompts():
    mirror, p_cache = PrefixMirror(4, 16), RadixCache(4, 16)
    prompts = [list(range(10)), list(range(12)) + [99], [5] * 9, list(range(8)), [7] * 20]
    for prompt in prompts:  # P does match then insert, in routing (FIFO) order
        expected = mirror.route(prompt)
        assert expected == p_cache.match(prompt).n_tokens
        p_cache.insert(prompt)


def test_the_wan_time_counts_what_md_lacks_when_the_router_knows_it():
    # P holds 16000 of 16384 tokens, MD none of them: the whole prompt crosses
    p_only = RouteInputs(16384, 1000, 16000, 0, md_hit_tokens=0)
    d = choose_pipeline(Mode.PDD, CFG, TIMING, p_only, 10.0)
    assert d.pipeline == Pipeline.P_RLD_MD and d.expected_wan_s == pytest.approx(
        expected_wan_s(16384, TIMING, 10.0, 0.1))
    both = RouteInputs(16384, 1000, 16000, 0, md_hit_tokens=16000)
    assert choose_pipeline(Mode.PDD, CFG, TIMING, both, 10.0).pipeline == Pipeline.P_MD


def test_a_mirror_can_be_asked_without_recording():
    m = PrefixMirror(16, 1024)
    prompt = tuple(range(64))
    assert m.hit(prompt) == 0 and m.hit(prompt) == 0  # asking does not insert
    m.record(prompt)
    assert m.hit(prompt + (1, 2)) == 64
