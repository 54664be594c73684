"""The routing decisions judged in hindsight (testbed/report/hindsight.py), on synthetic
records whose times are chosen so that each case's answer is known."""

from __future__ import annotations

import pytest

from testbed.decision import Decision, Reserve, Routing
from testbed.report.hindsight import WORST_N, estimates, hindsight, judge, kind

T0 = 1000.0  # t_sent of every record (the monotonic clock the roles share)
SHORT = "short transfer: relaying gains 0.20 s (0.20 s + margin 0.00 s - local 0.00 s)"
RELAY = "long transfer (2.00 s): relay"
LATE = "KV would reach MD (30.00 s) after RLD's last token (20.00 s): no WAN transfer"


# a routing whose inputs hindsight does not read unless a test sets them
ROUTING = {f: 0 for f in Routing.__dataclass_fields__} | {"policy": "pdd"}


def rec(rid, pipeline, reason, p_end, ttft, kv_done=None, relay_ms=None, e2e=None,
        status="completed", reserves=(), **routing):
    """A record: P's prefill ends at T0 + p_end, the first token comes at T0 + ttft; the
    router's decision as the router writes it."""
    decision = Decision(pipeline, reason, "pdd", ("MAIN_DECODE", "PREFILL", "RELAY_DECODE"),
                        {}, Routing(**(ROUTING | routing)), tuple(reserves))
    reports = {"router": decision.data(),
               "P": {"t_prefill_end": T0 + p_end}}
    if kv_done is not None:
        reports["MD"] = {"t_kv_done": T0 + kv_done}
    return {"id": rid, "status": status, "t_sent": T0, "ttft_s": ttft, "e2e_s": e2e,
            "relay_overhead_ms": relay_ms, "kv_at_md": {}, "reports": reports}


# A mode with two relayed requests (relay overhead 10 and 30 ms: median 20 ms) and two
# p-md requests whose first token came 50 and 70 ms after their KV (median 60 ms).
BASE = [
    rec(1, "p-rld-md", RELAY, p_end=1.0, ttft=1.01, kv_done=4.0, relay_ms=10),
    rec(2, "p-rld-md", RELAY, p_end=1.0, ttft=1.03, kv_done=4.0, relay_ms=30),
    rec(3, "p-md", SHORT, p_end=1.0, ttft=1.25, kv_done=1.2),
    rec(4, "p-md", SHORT, p_end=1.0, ttft=1.27, kv_done=1.2),
]


def test_the_estimates_are_the_modes_measured_medians():
    est = estimates(BASE)
    assert est["relay_overhead_s"] == pytest.approx(0.020)
    assert est["md_first_step_s"] == pytest.approx(0.060)
    assert (est["relay_overhead_n"], est["md_first_step_n"]) == (2, 2)


def test_a_p_md_decision_is_reversed_when_relaying_would_have_gained_the_threshold():
    est = estimates(BASE)
    late = rec(5, "p-md", SHORT, p_end=1.0, ttft=2.0, kv_done=1.95)  # KV 0.95 s after P
    v = judge(late, est, relay_threshold_s=0.5)
    assert v["other_ttft_s"] == pytest.approx(1.02)  # P's end + the 20 ms relay overhead
    assert v["gain_s"] == pytest.approx(0.98) and v["reversed"]
    assert v["cost_s"] == pytest.approx(0.98)
    on_time = rec(6, "p-md", SHORT, p_end=1.0, ttft=1.3, kv_done=1.25)  # gains 0.28 s < 0.5
    v = judge(on_time, est, relay_threshold_s=0.5)
    assert not v["reversed"] and v["cost_s"] == 0
    assert judge(on_time, est, relay_threshold_s=0.2)["reversed"]  # the mode's threshold


def test_a_relay_is_reversed_when_the_kv_reached_md_in_time():
    est = estimates(BASE)
    early = rec(7, "p-rld-md", RELAY, p_end=1.0, ttft=1.02, kv_done=1.1, relay_ms=20)
    v = judge(early, est, relay_threshold_s=0.5)
    assert v["other_ttft_s"] == pytest.approx(1.16)  # KV at MD + its 60 ms first step
    assert v["gain_s"] == pytest.approx(0.14) and v["reversed"]
    assert v["cost_s"] == 0  # relaying was still sooner, by less than the threshold
    beaten = rec(8, "p-rld-md", RELAY, p_end=1.0, ttft=1.5, kv_done=1.1, relay_ms=500)
    v = judge(beaten, est, relay_threshold_s=0.5)
    assert v["reversed"] and v["cost_s"] == pytest.approx(0.34)  # MD's token: 1.16 s
    assert not judge(BASE[0], est, relay_threshold_s=0.5)["reversed"]  # KV 3 s later


def test_an_rld_only_decision_is_reversed_when_the_predicted_kv_beat_rlds_decode():
    # P ends at 1 s, RLD's last token at 21 s: its decode took 20 s
    spared = rec(9, "rld-only", LATE, p_end=1.0, ttft=1.02, e2e=21.0, late_kv_wan_s=15.0)
    kept = rec(10, "rld-only", LATE, p_end=1.0, ttft=1.02, e2e=21.0, late_kv_wan_s=30.0)
    assert judge(spared, {}, 0.5)["reversed"] and judge(spared, {}, 0.5)["cost_s"] == 0
    assert not judge(kept, {}, 0.5)["reversed"]


@pytest.mark.parametrize("record", [
    rec(11, "p-md", "baseline: all p-md", p_end=1.0, ttft=5.0, kv_done=4.9),
    rec(12, "p-md", "warm-up: p-md fills P's cache and MD's DRC", p_end=1.0, ttft=5.0),
    rec(13, "rld-only", "anomalous: long input, short output", p_end=1.0, ttft=1.1),
    rec(14, "p-md", "long transfer (2.00 s), RLD full: batch 4 of 4", p_end=1.0, ttft=5.0),
    rec(15, "rld-only", "long transfer: decode on RLD", p_end=1.0, ttft=1.1),
    rec(16, "p-md", SHORT, p_end=1.0, ttft=None, status="failed"),
    rec(17, "p-md", SHORT, p_end=1.0, ttft=5.0, kv_done=4.9,
        reserves=[Reserve("p-md->re-served-rld-only", "re-served after MD lost", 1, 3,
                          "MAIN_DECODE", T0 + 1.5, ("PREFILL", "RELAY_DECODE"), "pdd")]),
])
def test_decisions_the_rule_did_not_make_from_a_prediction_are_not_judged(record):
    assert kind(record) is None and judge(record, estimates(BASE), 0.5) is None


def test_without_relayed_requests_a_p_md_counterfactual_uses_the_predicted_local_time():
    only = [rec(1, "p-md", SHORT, p_end=1.0, ttft=2.0, kv_done=1.9, predicted_local_s=0.1)]
    v = hindsight(only, 0.5)["worst"][0]
    assert v["other_ttft_s"] == pytest.approx(1.1) and v["cost_s"] == pytest.approx(0.9)


def test_the_modes_figures_count_share_and_rank_the_reversals():
    late = [rec(100 + i, "p-md", SHORT, p_end=1.0, ttft=2.0 + i / 10, kv_done=1.9 + i / 10)
            for i in range(12)]
    h = hindsight(BASE + late, relay_threshold_s=0.5)
    assert (h["judged"], h["reversed"]) == (16, 12)
    assert h["decision_regret_share"] == pytest.approx(12 / 16)
    assert h["by_pipeline"]["p-md"] == {"judged": 14, "reversed": 12,
                                        "cost_s": pytest.approx(sum(0.98 + i / 10
                                                                    for i in range(12)))}
    assert h["by_pipeline"]["p-rld-md"]["reversed"] == 0
    assert len(h["worst"]) == WORST_N and h["worst"][0]["id"] == 111
    assert [w["cost_s"] for w in h["worst"]] == sorted((w["cost_s"] for w in h["worst"]),
                                                       reverse=True)
    assert h["cost_s_max"] == pytest.approx(2.08)


def test_a_mode_without_judged_decisions_has_no_share():
    base = [rec(1, "p-md", "baseline: all p-md", p_end=1.0, ttft=5.0, kv_done=4.9)]
    h = hindsight(base, 0.5)
    assert h["judged"] == 0 and h["decision_regret_share"] is None and h["worst"] == []


def test_the_worst_list_takes_any_request_ids():
    late = [rec(i, "p-md", SHORT, p_end=1.0, ttft=2.0, kv_done=1.9) for i in ("b", None, 3)]
    assert [w["id"] for w in hindsight(BASE + late, 0.5)["worst"]] == [3, None, "b"]  # by str


def test_a_relay_made_on_measured_loss_is_judged_like_any_relay():
    """Relayed because the WAN was lossy: judged by what relaying gained. Its KV reached
    MD 0.1 s after P's prefill end, so MD would have had its first token at 1.16 s
    against RLD's 1.01 s: relaying gained 0.15 s, less than the 0.5 s threshold."""
    lossy = ("lossy WAN (9.8% of segments retransmitted; relaying gains 0.10 s as "
             "predicted): relay")
    r = rec(9, "p-rld-md", lossy, p_end=1.0, ttft=1.01, kv_done=1.1, relay_ms=10)
    assert kind(r) == "p-rld-md"
    j = judge(r, estimates(BASE), relay_threshold_s=0.5)
    assert j["gain_s"] == pytest.approx(0.15) and j["reversed"]
    assert kind(rec(9, "p-md", "lossy WAN (5.0% ...), RLD full: batch 4 of 4", p_end=1.0,
                    ttft=2.0)) is None  # RLD full: not a prediction's decision


def test_another_policys_decisions_are_judged_by_their_pipeline():
    """always-relay's relays are judged whatever their reason; a forced p-md is not."""
    relay = rec(9, "p-rld-md", "always-relay: relay", p_end=1.0, ttft=1.01, kv_done=1.1,
                relay_ms=10, policy="always-relay")
    assert kind(relay) == "p-rld-md"
    assert judge(relay, estimates(BASE), relay_threshold_s=0.5)["reversed"]
    mine = rec(9, "p-md", "MD holds 0.20: p-md", p_end=1.0, ttft=2.0, policy="x.py:Mine")
    assert kind(mine) == "p-md"
    for reason in ("warm-up", "MD holds 0.10, RLD full: batch 4 of 4",
                   "prompt 5 tokens, no live RELAY_DECODE"):
        assert kind(rec(9, "p-md", reason, p_end=1.0, ttft=2.0, policy="x.py:Mine")) is None
    # PDD's rule keeps its reason-based judgement: an unknown reason is not judged
    assert kind(rec(9, "p-md", "something else", p_end=1.0, ttft=2.0, policy="pdd")) is None


def placed(rid, md, held, *, n=1000, p_end=1.0, kv_done=1.5, tokens=(2.0, 0.1, 11),
           pipeline="p-md", others=None):
    """A p-md request of ``n`` prompt tokens placed on ``md`` holding ``held`` of them;
    MD's tokens at T0 + start, start + step, ... (``tokens``: start, step, count)."""
    start, step, count = tokens
    cands = {md: {"active": 1, "held_tokens": held, "transfer_s": 0.1, "decode_s": 1.0}}
    cands.update(others or {})
    decision = Decision(pipeline, SHORT, "pdd", ("MAIN_DECODE", "PREFILL"),
                        {"MAIN_DECODE": md, "PREFILL": "p1"}, Routing(**ROUTING),
                        placement={"MAIN_DECODE": cands})
    toks = [[i, 1, start + i * step, "MD"] for i in range(count)]
    return {"id": rid, "status": "completed", "t_sent": T0, "prompt_len": n,
            "ttft_s": start, "e2e_s": toks[-1][2], "tokens": toks,
            "reports": {"router": decision.data(), "P": {"t_prefill_end": T0 + p_end},
                        "MD": {"t_kv_done": T0 + kv_done}}}


def other(held):
    return {"md2": {"active": 0, "held_tokens": held, "transfer_s": 0.1, "decode_s": 1.0}}


def test_a_placement_is_reversed_when_an_idle_md_would_have_finished_sooner():
    # md1 decodes at 100 ms a token (a crowded batch), md2 at 10 ms (its own request);
    # the request held nothing on either, so its KV would have taken as long
    busy = placed(1, "md1", 0, others=other(0))
    quick = placed(2, "md2", 0, tokens=(2.0, 0.01, 11), others={
        "md1": {"active": 3, "held_tokens": 0, "transfer_s": 0.1, "decode_s": 3.0}})
    h = hindsight([busy, quick], 0.5)["placement"]
    assert h["judged"] == 2 and h["reversed"] == 1
    v = h["worst"][0]
    assert (v["id"], v["md"], v["other_md"]) == (1, "md1", "md2")
    # md1: first token at 2.0, then 10 x 100 ms -> 3.0 s; on md2: the same KV wait and first
    # step, then 10 x 10 ms (md2's measured step at the time) -> 2.1 s
    assert v["finish_s"] == pytest.approx(3.0) and v["other_finish_s"] == pytest.approx(2.1)
    assert v["cost_s"] == pytest.approx(0.9)


def test_a_held_prefix_counts_the_transfer_the_other_md_would_have_needed():
    # 900 of 1000 tokens held on md1: the KV wait there was 0.5 s for 100 tokens; md2 lacks
    # all 1000: 5 s. md2 decodes faster, but not 4.5 s faster.
    kept = placed(1, "md1", 900, others=other(0))
    other_md = placed(2, "md2", 0, tokens=(2.0, 0.01, 11), others={
        "md1": {"active": 3, "held_tokens": 0, "transfer_s": 0.1, "decode_s": 3.0}})
    h = hindsight([kept, other_md], 0.5)["placement"]
    assert h["judged"] == 2 and all(v["id"] != 1 for v in h["worst"])  # 6.6 s there


def test_placements_with_one_candidate_or_a_relay_are_not_judged():
    alone = placed(1, "md1", 0)
    relayed = placed(2, "md1", 0, pipeline="p-rld-md", others=other(0))
    assert hindsight([alone, relayed], 0.5)["placement"]["judged"] == 0
