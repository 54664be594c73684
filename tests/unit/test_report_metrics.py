"""report.metrics on hand-made records with known answers: percentiles, TPOT,
goodput within an SLA, RLD/relay shares, bytes x scale, comparisons."""

from __future__ import annotations

import pytest

from testbed.report.metrics import (MODE_KEYS, Sla, compare, link_bytes, metric_value,
                                    mode_metrics, paired_metrics, paired_ttft_ratios, percentile,
                                    producer_of, tpot_ms, workload_window)
from testbed.report.rundir import LinkSample

EVENTS = [{"t_mono": 100.0, "kind": "workload_start"}, {"t_mono": 103.0, "kind": "fault_start"},
          {"t_mono": 110.0, "kind": "workload_end"}]


def rec(rid, ttft=0.5, e2e=2.5, producers=("MD",) * 11, status="completed",
        pipeline="p-md", b=None, stall=None, t_sent=100.0, lost=0, dup=0):
    toks = [[i, 7, None if ttft is None else ttft + i * 0.01, p] for i, p in enumerate(producers)]
    return {"id": rid, "status": status, "pipeline": pipeline, "ttft_s": ttft, "e2e_s": e2e,
            "t_sent": t_sent, "tokens": toks, "tokens_lost": lost, "tokens_duplicated": dup,
            "bytes": b or {}, "handoff": None if stall is None else {"stall_ms": stall}}


@pytest.mark.parametrize("q, want", [(50, 2.5), (90, 3.7), (99, 3.97), (0, 1.0), (100, 4.0)])
def test_percentile_is_numpy_linear(q, want):
    assert percentile([4, None, 1, 3, 2], q) == pytest.approx(want)


def test_percentile_of_nothing_is_null():
    assert percentile([], 50) is None
    assert percentile([None, None], 99) is None


def test_tpot_is_decode_time_over_tokens_after_the_first():
    assert tpot_ms(rec(1, ttft=0.5, e2e=2.5)) == pytest.approx(200.0)  # 2 s / 10
    assert tpot_ms(rec(1, producers=("MD",))) is None                  # one token: no TPOT
    dup = rec(1, ttft=0.5, e2e=1.5, producers=("MD",) * 3)
    dup["tokens"].append(list(dup["tokens"][-1]))                      # a duplicate position
    assert tpot_ms(dup) == pytest.approx(500.0)                        # 1 s / (3 - 1)


def goodput_records():
    return [rec(1, ttft=0.5, e2e=1.0),                  # in SLA: TPOT 50 ms
            rec(2, ttft=1.5, e2e=2.0),                  # TTFT over 1 s
            rec(3, ttft=0.5, e2e=2.0),                  # TPOT 150 ms
            rec(4, ttft=None, e2e=None, producers=(), status="failed"),
            rec(5, ttft=0.9, e2e=0.9, producers=("MD",))]  # one token: no TPOT to check


def test_goodput_counts_completed_requests_within_both_bounds_per_workload_second():
    m = mode_metrics(goodput_records(), EVENTS, Sla(ttft_s=1.0, tpot_ms=100), scale=1.0)
    assert m["goodput_rps"] == pytest.approx(2 / 10)


@pytest.mark.parametrize("sla, want", [(Sla(), 4 / 10), (Sla(ttft_s=1.0), 3 / 10),
                                       (Sla(tpot_ms=100), 3 / 10)])
def test_goodput_checks_only_the_bounds_given(sla, want):
    assert mode_metrics(goodput_records(), EVENTS, sla, 1.0)["goodput_rps"] == pytest.approx(want)


def test_sla_from_resolved_scenario():
    assert Sla.from_resolved({"sla": {"ttft_s": 2, "tpot_ms": 50}}) == Sla(2, 50)
    assert Sla.from_resolved({}).empty


def test_workload_window_falls_back_to_the_requests_span():
    records = [rec(1, e2e=2.0, t_sent=50.0), rec(2, e2e=3.0, t_sent=51.0)]
    assert workload_window(EVENTS, records) == (100.0, 110.0)
    assert workload_window([], records) == (50.0, 54.0)
    assert workload_window([], []) is None
    assert mode_metrics(records[:0], [], Sla(), 1.0)["goodput_rps"] is None


@pytest.mark.parametrize("name, want", [("RLD", "RLD"), ("relay_decode", "RLD"), (2, "RLD"),
                                        ("MD", "MD"), ("main_decode", "MD"), ("P", "P"),
                                        ("router", None), (None, None)])
def test_producer_names_are_normalised(name, want):
    assert producer_of([0, 1, 0.1, name]) == want


def test_rld_token_share_and_relayed_share_are_over_completed_requests():
    records = [rec(1, producers=("RLD",) * 3 + ("MD",) * 7, pipeline="p-rld-md"),
               rec(2, producers=("MD",) * 10),
               rec(3, producers=("RLD",) * 5, pipeline="p-rld-md", status="failed")]
    m = mode_metrics(records, EVENTS, Sla(), 1.0)
    assert m["rld_token_share"] == pytest.approx(3 / 20)
    assert m["relayed_share"] == pytest.approx(1 / 2)


@pytest.mark.parametrize("pipeline, relayed", [("p-md", False), ("p-rld-md", True),
                                               ("rld-only", True), ("p-rld-md->rld", True)])
def test_relayed_means_the_pipeline_involved_rld(pipeline, relayed):
    m = mode_metrics([rec(1, pipeline=pipeline)], EVENTS, Sla(), 1.0)
    assert m["relayed_share"] == (1.0 if relayed else 0.0)


def test_bytes_are_emulated_times_scale_over_all_requests_emulated_kept():
    records = [rec(1, b={"kv_wan": 100, "handoff": 10, "kv_intra": 50, "tokens": 99}),
               rec(2, b={"kv_wan": 200}),
               rec(3, status="failed", b={"kv_wan": 1000})]  # failed requests used the WAN too
    m = mode_metrics(records, EVENTS, Sla(), scale=10.0)
    assert m["emulated"] == {"wan_bytes": 1310, "intra_dc_bytes": 50}
    assert (m["wan_bytes"], m["intra_dc_bytes"]) == (13100, 500)


def test_handoff_stall_p99_and_token_counts():
    records = [rec(1, stall=100.0, lost=1), rec(2, stall=200.0, dup=2), rec(3),
               rec(4, stall=5000.0, status="failed", lost=3)]
    m = mode_metrics(records, EVENTS, Sla(), 1.0)
    assert m["handoff_stall_p99_ms"] == pytest.approx(199.0)
    assert (m["tokens_lost"], m["tokens_duplicated"]) == (4, 2)
    assert (m["requests_total"], m["requests_completed"], m["requests_failed"]) == (4, 3, 1)


def test_a_mode_with_no_completed_request_has_null_percentiles_and_contract_keys():
    m = mode_metrics([rec(1, status="failed", ttft=None, e2e=None, producers=())], [], Sla(), 1.0)
    assert tuple(m) == MODE_KEYS
    nulls = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_ms", "e2e_p99_s",
             "handoff_stall_p99_ms", "rld_token_share", "relayed_share")
    assert all(m[k] is None for k in nulls)


def test_metric_value_reaches_emulated_and_rejects_unknown_names():
    m = mode_metrics([rec(1, b={"kv_wan": 5})], EVENTS, Sla(), 4.0)
    assert metric_value(m, "wan_bytes") == 20
    assert metric_value(m, "emulated.wan_bytes") == 5
    with pytest.raises(KeyError):
        metric_value(m, "ttft_p75_s")


def test_compare_gives_ratio_and_change_and_nulls_when_undefined():
    modes = {"pdd": {"ttft_p90_s": 1.0, "wan_bytes": 5, "goodput_rps": None},
             "base": {"ttft_p90_s": 4.0, "wan_bytes": 0, "goodput_rps": 1.0}}
    rows = compare(modes, ["ttft_p90_s", "wan_bytes", "goodput_rps"], [("pdd", "base")])
    assert rows[0] == {"metric": "ttft_p90_s", "mode": "pdd", "baseline": "base", "value": 1.0,
                       "baseline_value": 4.0, "ratio": 0.25, "change_pct": -75.0}
    assert rows[1]["ratio"] is None and rows[1]["change_pct"] is None  # baseline 0
    assert rows[2]["ratio"] is None                                    # null value


def test_link_bytes_is_last_minus_first_counter_per_direction():
    rows = [LinkSample(t, "wan", d, b, 0, 0, 10.0, 1.0) for t, d, b in
            [(2.0, "a>b", 900), (1.0, "a>b", 100), (1.0, "b>a", 5), (2.0, "b>a", 7)]]
    rows.append(LinkSample(1.0, "host:p1", "up", 10**9, 0, 0, 100.0, 10.0))
    assert link_bytes(rows, "wan") == {"a>b": 800, "b>a": 2}


def test_relay_overhead_percentiles_are_over_completed_relayed_requests():
    def relayed(rid, ms, pipeline="p-rld-md", status="completed"):
        return dict(rec(rid, pipeline=pipeline, status=status), relay_overhead_ms=ms)

    records = [relayed(1, 40.0), relayed(2, 60.0, "rld-only"), relayed(3, 20.0, "p-rld-md->rld"),
               relayed(4, 900.0, status="failed"),       # not completed
               relayed(5, None),                          # RLD emitted nothing (handed over first)
               dict(rec(6), relay_overhead_ms=500.0)]     # p-md: not relayed
    m = mode_metrics(records, EVENTS, Sla(), 1.0)
    assert m["relay_overhead_p50_ms"] == pytest.approx(40.0)
    assert m["relay_overhead_p90_ms"] == pytest.approx(56.0)
    assert metric_value(m, "relay_overhead_p50_ms") == pytest.approx(40.0)  # usable in bounds


def test_relay_overhead_is_null_when_nothing_was_relayed():
    m = mode_metrics([rec(1), rec(2, pipeline="cross-dc")], EVENTS, Sla(), 1.0)
    assert m["relay_overhead_p50_ms"] is None and m["relay_overhead_p90_ms"] is None


def test_high_hit_ttft_p50_is_over_completed_requests_designed_at_least_90_pct():
    def designed(rid, hit, ttft, status="completed"):
        return dict(rec(rid, status=status), designed_hit_rate=hit, ttft_s=ttft)

    records = [designed(1, 0.95, 0.2), designed(2, 0.9, 0.4), designed(3, 0.99, 0.3),
               designed(4, 0.5, 9.0),                    # low hit: not in it
               designed(5, 0.97, 7.0, status="failed"),  # not completed
               dict(rec(6), ttft_s=8.0)]                 # no designed hit (a trace)
    m = mode_metrics(records, EVENTS, Sla(), 1.0)
    assert m["ttft_high_hit_p50_s"] == pytest.approx(0.3)
    assert m["ttft_p50_s"] > m["ttft_high_hit_p50_s"]
    assert metric_value(m, "ttft_high_hit_p50_s") == pytest.approx(0.3)  # usable in bounds


def test_high_hit_ttft_is_null_for_a_workload_that_designs_no_hit():
    assert mode_metrics([rec(1), rec(2)], EVENTS, Sla(), 1.0)["ttft_high_hit_p50_s"] is None


def _req(i, ttft, pipeline="p-md", status="completed", prompt_len=100):
    return {"id": i, "ttft_s": ttft, "pipeline": pipeline, "status": status,
            "prompt_len": prompt_len}


def test_paired_ttft_ratio_is_the_median_over_requests_the_mode_did_not_relay():
    mode = [_req(0, 0.2), _req(1, 0.3), _req(2, 0.9), _req(3, 0.5, pipeline="p-rld-md"),
            _req(4, 0.1, status="failed"), _req(5, 0.4)]
    base = [_req(0, 0.2), _req(1, 0.2), _req(2, 0.3), _req(3, 2.0), _req(4, 0.1),
            _req(5, 0.1, status="failed")]
    # paired: 0 (1.0), 1 (1.5), 2 (3.0); 3 relayed, 4 failed in the mode, 5 in the baseline
    assert paired_ttft_ratios(mode, base) == pytest.approx([1.0, 1.5, 3.0])
    assert paired_metrics(mode, base) == {"paired_ttft_ratio_p50": pytest.approx(1.5), "n": 3}


def test_paired_ttft_ratio_ignores_one_request_crossing_the_median():
    # two unpaired medians of 4 requests move 25% when one request swaps sides;
    # the paired median sees every request served as fast in both modes but one
    base = [_req(0, 0.10), _req(1, 0.15), _req(2, 0.20), _req(3, 0.25)]
    mode = [_req(0, 0.10), _req(1, 0.30), _req(2, 0.20), _req(3, 0.25)]
    assert percentile([r["ttft_s"] for r in mode], 50) / percentile(
        [r["ttft_s"] for r in base], 50) == pytest.approx(0.225 / 0.175)
    assert paired_metrics(mode, base)["paired_ttft_ratio_p50"] == pytest.approx(1.0)


def test_paired_ttft_ratio_refuses_to_pair_different_prompts_and_is_null_without_pairs():
    mode = [_req(0, 0.2, prompt_len=100)]
    base = [_req(0, 0.1, prompt_len=101)]
    assert paired_metrics(mode, base) == {"paired_ttft_ratio_p50": None, "n": 0}
    assert paired_metrics([_req(0, 0.2, pipeline="rld-only")], [_req(0, 0.1)])["n"] == 0


def test_hit_rates_are_over_requests_with_both_and_the_gap_is_p_minus_md():
    a, b, c, d = rec(1), rec(2), rec(3, pipeline="rld-only"), rec(4, status="failed")
    a.update(p_hit_rate=0.96, md_hit_rate=0.96)
    b.update(p_hit_rate=0.90, md_hit_rate=0.70)          # MD lacked 20 points of P's prefix
    c.update(p_hit_rate=0.10, md_hit_rate=None)          # never reached MD: not counted
    d.update(p_hit_rate=0.0, md_hit_rate=0.0)            # failed: not counted
    m = mode_metrics([a, b, c, d], EVENTS, Sla(), scale=1.0)
    assert m["p_hit_rate_mean"] == pytest.approx(0.93)
    assert m["md_hit_rate_mean"] == pytest.approx(0.83)
    assert m["drc_hit_gap"] == pytest.approx(0.10)
    none = mode_metrics([c], EVENTS, Sla(), scale=1.0)
    assert none["p_hit_rate_mean"] is none["drc_hit_gap"] is None


def test_wan_kv_share_is_bytes_over_the_a_to_b_capacity_of_the_window():
    # 10 s window at 0.4 Gbit/s emulated = 500 MB; 200 MB of KV + 1 MB handoff
    links = [LinkSample(t, "wan", "a>b", 0, 0, 0, 10.0, 0.4) for t in (99.0, 100.0, 105.0, 110.0)]
    links += [LinkSample(t, "wan", "b>a", 0, 0, 0, 10.0, 0.1) for t in (100.0, 110.0)]
    r = rec(1, b={"kv_wan": 200_000_000, "handoff": 1_000_000, "kv_intra": 5})
    m = mode_metrics([r], EVENTS, Sla(), scale=25.0, links=links)
    assert m["wan_kv_share"] == pytest.approx(201e6 / 500e6)
    # halve the rate from t = 105: the mean of the rows in the window (links.csv rows are
    # periodic, so this is the time average to within one sampling interval)
    slow = links[:2] + [LinkSample(105.0, "wan", "a>b", 0, 0, 0, 5.0, 0.2),
                        LinkSample(110.0, "wan", "a>b", 0, 0, 0, 5.0, 0.2)]
    assert mode_metrics([r], EVENTS, Sla(), 25.0, slow)["wan_kv_share"] == pytest.approx(
        201e6 / ((0.4 + 0.2 + 0.2) / 3 * 1e9 / 8 * 10))
    assert mode_metrics([r], EVENTS, Sla(), 25.0, ())["wan_kv_share"] is None


def test_ttft_mean_is_over_completed_requests():
    recs = [rec(1, ttft=0.5), rec(2, ttft=1.5), rec(3, ttft=9.0, status="failed")]
    assert mode_metrics(recs, EVENTS, Sla(), 1.0)["ttft_mean_s"] == pytest.approx(1.0)
    assert mode_metrics([rec(3, status="failed")], EVENTS, Sla(), 1.0)["ttft_mean_s"] is None


def test_after_prefill_is_the_first_token_minus_ps_prefill_end():
    a, b, c = rec(1, ttft=2.0, t_sent=100.0), rec(2, ttft=5.0, t_sent=100.0), rec(3)
    a["reports"] = {"P": {"t_prefill_end": 101.5}}   # 0.5 s after the prefill
    b["reports"] = {"P": {"t_prefill_end": 101.0}}   # 4 s: a WAN KV wait
    m = mode_metrics([a, b, c], EVENTS, Sla(), 1.0)  # c has no P report: not counted
    assert m["after_prefill_p50_s"] == pytest.approx(2.25)
    assert m["after_prefill_p90_s"] == pytest.approx(0.5 + 0.9 * 3.5)
