"""Synthetic workloads: hit-rate histograms as a 16-token prefix cache measures them,
arrival statistics, session prefix reuse, determinism.

Tolerances are statistical: with n requests, a bin share p has standard
error sqrt(p(1-p)/n) <= 0.0112 at n = 2000, so 0.035 is > 3 standard errors,
plus the cold starts (one hit-0 request per shared system prompt, 4 here).
"""

from __future__ import annotations

import numpy as np
import pytest

from testbed.pdd.compute.radix import RadixCache
from testbed.reader import Fields
from testbed.workload import build_workload, parse_workload
from testbed.workload.arrivals import ArrivalProcess, ArrivalSpec, arrival_times
from testbed.workload.cachesim import measure_hit_tokens
from testbed.workload.hitrate import HitBin, histogram
from testbed.workload.synthetic import fit_length, generate_synthetic
from testbed.workload.tokens import VOCAB_SIZE

N = 2000
BIN_TOL = 0.035


def spec_of(**changes):
    data = {
        "kind": "synthetic", "seed": 11, "n_requests": N,
        "arrival": {"process": "poisson", "rate_rps": 5},
        "input_len": {"dist": "uniform", "min_tokens": 512, "max_tokens": 2048},
        "output_len": {"dist": "uniform", "min_tokens": 8, "max_tokens": 256},
        "hit_rate": {"mean_pct": 90},
    }
    data.update(changes)
    data = {k: v for k, v in data.items() if v is not None}
    return parse_workload(Fields(data, "t.yaml", "workload"))


@pytest.fixture(scope="module")
def pdd_workload():
    weights = [0.2, 0.1, 0.1, 0.1, 0.15, 0.15, 0.2]
    return build_workload(spec_of(hit_rate={"pdd_bins": weights})), weights


@pytest.fixture(scope="module")
def mean90_workload():
    return build_workload(spec_of())


def test_pdd_bins_histogram_measured_by_the_cache(pdd_workload):
    wl, weights = pdd_workload
    shares = [b.share for b in wl.stats.hit_histogram]
    assert sum(shares) == pytest.approx(1.0)
    for share, w in zip(shares, weights):
        assert abs(share - w) <= BIN_TOL, (shares, weights)


def test_custom_bins_with_point_masses_and_a_narrow_bin():
    bins = [{"lo_pct": 0, "hi_pct": 0, "weight": 1}, {"lo_pct": 39.5, "hi_pct": 40.5, "weight": 1},
            {"lo_pct": 95, "hi_pct": 100, "weight": 1}, {"lo_pct": 100, "hi_pct": 100, "weight": 1}]
    wl = build_workload(spec_of(hit_rate={"bins": bins}))
    shares = [b.share for b in wl.stats.hit_histogram]
    for share in shares:
        assert abs(share - 0.25) <= BIN_TOL, shares
    assert sum(shares) == pytest.approx(1.0)  # nothing fell between the bins


def test_mean_90_default_shape(mean90_workload):
    st = mean90_workload.stats
    # per-request hit sd is ~25 points: the mean's standard error is ~0.6 points at n = 2000
    assert st.hit_rate_mean == pytest.approx(0.90, abs=0.02)
    assert st.hit_rate_token_weighted == pytest.approx(0.90, abs=0.03)
    above_95 = sum(b.share for b in st.hit_histogram if b.lo_pct >= 95)
    assert 0.70 <= above_95 <= 0.80


def test_designed_hits_are_exactly_what_the_cache_measures(pdd_workload, mean90_workload):
    for wl in (pdd_workload[0], mean90_workload):
        designed = [r.designed_hit_rate for r in wl.requests]
        assert designed == pytest.approx(list(wl.measured_hit_rates), abs=1e-12)


def test_cache_sim_agrees_with_the_prefill_radix_cache(mean90_workload):
    prompts = [r.prompt for r in mean90_workload.requests[:300]]
    tree = RadixCache(block_size=16)  # unbounded
    expected = []
    for p in prompts:
        expected.append(tree.match(p).n_tokens)
        tree.insert(p)
    assert measure_hit_tokens(prompts) == expected


def test_turns_reuse_the_previous_prompt_of_their_session(mean90_workload):
    last: dict[int, tuple[int, ...]] = {}
    continued = reused = 0
    for r, hit in zip(mean90_workload.requests, mean90_workload.measured_hit_rates):
        prev = last.get(r.session)
        last[r.session] = r.prompt
        if prev is None:
            continue
        n_hit = round(hit * r.input_len)
        assert r.prompt[:n_hit] == prev[:n_hit]
        reused += n_hit > 0
        # continuation: previous prompt + output-ish tokens + user tokens
        continued += r.input_len > len(prev) and r.prompt[:len(prev)] == prev
    turns = len(mean90_workload.requests) - len({r.session for r in mean90_workload.requests})
    assert reused > 0.8 * turns
    assert continued > 0.3 * turns


def test_prompts_are_token_ids_and_lengths_respect_the_cap(mean90_workload):
    for r in mean90_workload.requests:
        assert 1 <= r.input_len <= 2048 and 8 <= r.output_len <= 256
        assert 0 <= min(r.prompt) and max(r.prompt) < VOCAB_SIZE
    st = mean90_workload.stats
    assert st.count == N and 512 <= st.input_len.mean <= 2048


def test_fixed_input_length_is_kept_for_high_hit_rates():
    wl = build_workload(spec_of(n_requests=300, input_len={"dist": "fixed", "tokens": 4096},
                                hit_rate={"bins": [{"lo_pct": 95, "hi_pct": 100, "weight": 1}]}))
    lens = [r.input_len for r in wl.requests]
    assert max(lens) == 4096 and min(lens) >= 4096 - 17  # rewinds shorten by < 16 / h tokens


def test_deterministic_from_the_seed():
    a, b = generate_synthetic(spec_of(n_requests=200).synthetic), \
        generate_synthetic(spec_of(n_requests=200).synthetic)
    assert a == b
    c = generate_synthetic(spec_of(n_requests=200, seed=12).synthetic)
    assert [r.prompt for r in a] != [r.prompt for r in c]


def test_arrival_process_does_not_change_prompts():
    a = generate_synthetic(spec_of(n_requests=200).synthetic)
    b = generate_synthetic(spec_of(n_requests=200, arrival={"process": "fixed",
                                                             "interval_s": 0.1}).synthetic)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert [r.arrival_s for r in b] == pytest.approx([0.1 * i for i in range(200)])


def test_poisson_interarrival_mean_and_cv():
    gaps = np.diff(arrival_times(ArrivalSpec(ArrivalProcess.POISSON, rate_rps=5.0),
                                 np.random.default_rng(1), n=4000))
    # standard errors at n = 4000: mean 1.6%, CV ~0.02
    assert gaps.mean() == pytest.approx(0.2, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.08)


def test_bursty_arrivals_are_bursty():
    spec = ArrivalSpec(ArrivalProcess.BURSTY, rate_rps=50.0, burst_size=10, burst_gap_s=2.0)
    times = arrival_times(spec, np.random.default_rng(2), n=4000)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() > 1.5
    assert len(times) / times[-1] == pytest.approx(spec.mean_rate_rps, rel=0.1)


def test_duration_mode_stops_at_the_duration():
    spec = ArrivalSpec(ArrivalProcess.POISSON, rate_rps=100.0)
    times = arrival_times(spec, np.random.default_rng(3), duration_s=60.0)
    assert times[0] == 0 and times[-1] <= 60.0 and np.all(np.diff(times) >= 0)
    assert len(times) == pytest.approx(6000, rel=0.05)  # Poisson sd ~77 requests
    wl = build_workload(spec_of(n_requests=None, duration_s=20.0))
    assert wl.stats.count == pytest.approx(100, rel=0.3) and wl.stats.span_s <= 20.0


def test_anomalous_requests():
    wl = build_workload(spec_of(anomalous={"share_pct": 4, "input_len": {"dist": "fixed",
                                                                          "tokens": 8192}}))
    odd = [r for r in wl.requests if r.anomalous]
    assert len(odd) / N == pytest.approx(0.04, abs=0.015)  # sd 0.0044
    assert all(r.input_len == 8192 and r.output_len < 500 for r in odd)
    assert len({r.session for r in odd}) == len(odd)
    normal = {r.session for r in wl.requests if not r.anomalous}
    assert not normal & {r.session for r in odd}


@pytest.mark.parametrize("hit,h,b,want", [
    (160, 0.95, HitBin(95, 96, 1), 168),
    (3968, 0.97, HitBin(96, 97, 1), 4091),
    (160, 0.995, HitBin(99, 100, 1), 161),
    (160, 1.0, HitBin(100, 100, 1), 160),
    (16, 0.5, HitBin(0, 90, 1), 32),
])
def test_fit_length_lands_in_the_bin(hit, h, b, want):
    n = fit_length(hit, h, b)
    assert n == want and b.contains(100 * hit / n)


def test_histogram_counts_point_bins_first():
    bins = (HitBin(0, 0, 0.5), HitBin(0, 100, 0.5))
    assert histogram([0.0, 0.0, 50.0, 100.0], bins) == (0.5, 0.5)


def test_warmup_sends_the_shared_prompts_first_and_leaves_no_cold_measured_request():
    sessions = {"concurrent": 8, "turns": 8, "shared_prefixes": 3}
    cold = build_workload(spec_of(n_requests=200, sessions=sessions))
    warm = build_workload(spec_of(n_requests=200, sessions={**sessions, "warmup": True}))
    assert cold.warmup == () and len(warm.warmup) == 3
    assert all(w.warmup and w.arrival_s == 0 and w.output_len == 16 for w in warm.warmup)
    assert [w.id for w in warm.warmup] == [200, 201, 202]
    assert [r.id for r in warm.requests] == list(range(200))
    # the first use of each shared prompt was a full-length cold request; now it is a hit
    n_cold = sum(r.designed_hit_rate == 0 and len(r.prompt) == 2048 for r in cold.requests)
    assert n_cold >= 3
    assert {w.prompt[:16] for w in warm.warmup} == {r.prompt[:16] for r in cold.requests
                                                   if r.designed_hit_rate == 0
                                                   and len(r.prompt) == 2048}
    # the designed hit rates are what a cache that saw the warm-up first measures
    designed = [r.designed_hit_rate for r in warm.requests]
    assert designed == pytest.approx(list(warm.measured_hit_rates), abs=1e-12)
    assert warm.stats.hit_rate_mean > cold.stats.hit_rate_mean


def test_the_client_reads_warmups_first_and_flagged_from_the_runners_workload_file(tmp_path):
    from testbed.pdd.roles.client import load_requests
    from testbed.scenario.roles import write_workload

    wl = build_workload(spec_of(n_requests=20, sessions={"concurrent": 4, "turns": 4,
                                                         "shared_prefixes": 2, "warmup": True}))
    path = tmp_path / "workload.jsonl"
    write_workload(path, wl)
    got = load_requests(path)
    assert [(r.id, r.warmup) for r in got] == [(20, True), (21, True)] + [
        (i, False) for i in range(20)]
    assert [r.prompt for r in got[:2]] == [w.prompt for w in wl.warmup]
    assert [r.max_out for r in got[2:]] == [r.output_len for r in wl.requests]
