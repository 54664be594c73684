"""Every mode end to end over the fake transport with a 50 ms (+-5 ms) WAN.

One cluster run per (mode, handoff mode, engine): pdd on the hash engine too
(both handoff modes), whose tokens cost microseconds; the assertions are the PDD
claims the roles must deliver: exact tokens (vs ``greedy_generate``), no
position lost or duplicated, producers as the pipeline says, TTFT of
relayed requests far below their WAN KV transfer, MD receiving only what
its DRC lacks, and handoff frames of token ids only.
"""

from __future__ import annotations

import pytest
from pdd_fixtures import EXPECTED, producers, run, run_on_fake_wan, small_config, workload

from testbed.pdd.run.verify import verify_records

CASES = [("pdd", "one-shot", "torch"), ("pdd", "catch-up", "torch"),
         ("cross-dc-pd", "catch-up", "torch"), ("same-dc-pd", "catch-up", "torch"),
         ("p-rld", "one-shot", "torch"), ("pdd", "one-shot", "hash"), ("pdd", "catch-up", "hash")]
PDD_CASES = [c for c in CASES if c[0] == "pdd"]
_RUNS: dict[tuple[str, str, str], list[dict]] = {}


def config_of(mode: str, handoff_mode: str, engine: str = "torch"):
    return small_config(mode, handoff_mode, model={"engine": engine})


def records_of(mode: str, handoff_mode: str, engine: str = "torch") -> list[dict]:
    if (mode, handoff_mode, engine) not in _RUNS:
        cfg = config_of(mode, handoff_mode, engine)
        _RUNS[(mode, handoff_mode, engine)] = run(run_on_fake_wan(cfg, workload()))[0]
    return _RUNS[(mode, handoff_mode, engine)]


@pytest.mark.parametrize("mode, handoff_mode, engine", CASES)
def test_every_token_equals_a_single_process_greedy_decode(mode, handoff_mode, engine):
    records = records_of(mode, handoff_mode, engine)
    assert [r["status"] for r in records] == ["completed"] * 5, [r["reason"] for r in records]
    verdicts = verify_records(records, config_of(mode, handoff_mode, engine).model)
    assert all(v.match for v in verdicts)
    assert all(r["tokens_lost"] == 0 and r["tokens_duplicated"] == 0 for r in records)
    assert [len(r["tokens"]) for r in records] == [r["max_out"] for r in records]


@pytest.mark.parametrize("mode, handoff_mode, engine", CASES)
def test_producers_follow_the_pipeline(mode, handoff_mode, engine):
    records = records_of(mode, handoff_mode, engine)
    pipelines = [r["pipeline"] for r in records]
    if mode == "pdd":
        # Decided from the config alone: request 0 meets the router's prior with nothing
        # ahead (predicted 0.21 s > 0.19 s: relay), request 3 is anomalous. The others'
        # routes depend on how much of the earlier KV is still on the real-time fake WAN
        # when they arrive, i.e. on the machine's speed: the rule that decides them is
        # tested without a clock in test_pdd_routing.py and test_wan_model.py.
        assert pipelines[0] == "p-rld-md" and pipelines[3] == "rld-only", pipelines
        assert set(pipelines) <= {"p-md", "p-rld-md", "rld-only"}, pipelines
    elif mode == "p-rld":
        # Requests 0-3 from the config alone. Request 4 (20 tokens, nothing on the WAN)
        # is predicted ~0.17-0.18 s against the 0.19 s threshold: live RTT probes on a
        # loaded machine move it across, so it is judged by the rule on what the router
        # recorded (its gain), not by a fixed answer.
        assert pipelines[:4] == EXPECTED[mode][:4]
        d = records[4]["reports"]["router"]
        gain = d["predicted_wan_s"] + d["wan_margin_s"] - d["predicted_local_s"]
        short = gain < small_config().router.relay_threshold_s
        assert pipelines[4] == ("p-md" if short else "rld-only"), d
    else:
        assert pipelines == EXPECTED[mode]
    for r in records:
        who = producers(r)
        if r["pipeline"] == "p-md":
            assert set(who) == {"MD"}
        elif r["pipeline"] == "rld-only":
            assert set(who) == {"RLD"} and r["bytes"]["kv_wan"] == 0
        elif r["handoff"]["tokens"] == 0:  # RLD reached the last token before MD had the KV
            assert set(who) == {"RLD"}
        else:  # RLD's eager tokens are a prefix, MD's the rest
            m = r["handoff"]["tokens"]
            assert 0 < m < len(who) and who == ["RLD"] * m + ["MD"] * (len(who) - m)


@pytest.mark.parametrize("mode, handoff_mode, engine", PDD_CASES)
def test_handoff_batches_follow_the_handoff_mode(mode, handoff_mode, engine):
    relayed = [r for r in records_of(mode, handoff_mode, engine) if r["pipeline"] == "p-rld-md"]
    assert relayed
    threshold = small_config().relay.catchup_threshold_tokens
    for r in relayed:
        assert r["handoff"]["mode"] == handoff_mode
        if handoff_mode == "one-shot" or r["handoff"]["tokens"] == 0:
            assert r["handoff"]["batches"] == 1
        elif r["handoff"]["tokens"] > threshold:  # catch-up: a first batch, then the rest
            assert r["handoff"]["batches"] >= 2, r["handoff"]
        else:
            assert r["handoff"]["batches"] >= 1
        if r["handoff"]["tokens"]:
            assert r["reports"]["MD"]["handoff_mismatches"] == 0


@pytest.mark.parametrize("handoff_mode", ["one-shot", "catch-up"])
def test_relayed_ttft_is_far_below_the_wan_kv_transfer(handoff_mode):
    records = records_of("pdd", handoff_mode)
    relayed = [r for r in records if r["pipeline"] == "p-rld-md" and "MD" in r["reports"]]
    assert relayed
    cross = records_of("cross-dc-pd", "catch-up")
    for r in relayed:
        # P -> MD: REQUEST crosses (50 ms), then KV_NEED sent -> last KV byte at MD. The
        # first token comes before this request's KV reached MD: the wait is hidden. (How
        # far before depends on the backlog this request met on the real-time fake WAN and
        # on the machine's speed: 0.138 s against 0.197 s was seen on a 2-core machine.)
        wan_s = 0.05 + r["reports"]["MD"]["kv_transfer_s"]
        assert r["ttft_s"] < wan_s, (r["ttft_s"], wan_s)
        same = cross[r["id"]]  # the same request sent p-md in the baseline
        assert r["ttft_s"] < same["ttft_s"] / 3, (r["ttft_s"], same["ttft_s"])


def test_relayed_requests_record_the_relay_overhead():
    """P's prefill end -> RLD's first token: inside the TTFT, and only where RLD emitted."""
    for r in records_of("pdd", "catch-up") + records_of("same-dc-pd", "catch-up"):
        if "rld" in r["pipeline"]:
            assert 0 < r["relay_overhead_ms"] < 1000 * r["ttft_s"], r["relay_overhead_ms"]
        else:
            assert r["relay_overhead_ms"] is None


def test_md_receives_only_what_its_drc_lacks():
    first, second = records_of("pdd", "catch-up")[0], records_of("pdd", "catch-up")[2]
    assert first["md_hit_rate"] == 0.0
    assert second["md_hit_rate"] == second["p_hit_rate"] > 0.9  # DRC aligned with P's cache
    assert second["bytes"]["kv_wan"] < first["bytes"]["kv_wan"] / 5
    assert second["reports"]["MD"]["kv_chunks"] == 1  # only the 20-token suffix crossed


@pytest.mark.parametrize("handoff_mode", ["one-shot", "catch-up"])
def test_handoff_frames_carry_token_ids_only(handoff_mode):
    kv_per_token = small_config().timing.modeled_kv_bytes(1)  # 5000 B on the wire
    relayed = [r for r in records_of("pdd", handoff_mode)
               if r["pipeline"] == "p-rld-md" and r["handoff"]["tokens"] > 0]
    assert relayed  # request 0 at least: 100 tokens, MD takes over
    for r in relayed:
        n, batches = r["handoff"]["tokens"], r["handoff"]["batches"]
        # 4-byte ids plus a frame head (< 64 B) per batch; KV would be 5000 B a token
        assert r["bytes"]["handoff"] <= 4 * n + 64 * batches, r["handoff"]
        assert r["bytes"]["handoff"] < n * kv_per_token / 100


def test_the_anomalous_request_never_crosses_the_wan():
    r = records_of("pdd", "catch-up")[3]
    assert r["pipeline"] == "rld-only" and r["bytes"]["kv_wan"] == 0
    assert r["bytes"]["kv_intra"] > 0 and r["md_hit_rate"] is None


def test_the_router_judges_the_wan_by_what_md_lacks_not_what_p_holds():
    """A prefix P cached from a request that never reached MD (anomalous,
    rld-only): the next turn hits 94 % at P and 0 % at MD, so its whole
    prompt crosses the WAN; the router must see that and relay it."""
    import random

    from testbed.pdd.roles.client_record import ClientRequest

    rng = random.Random(5)
    base = tuple(rng.randrange(512) for _ in range(150))
    reqs = [ClientRequest(0, 0.0, base, 40, "s1"),  # anomalous: 150 >= 140 in, 40 < 50 out
            ClientRequest(1, 1.5, base + tuple(rng.randrange(512) for _ in range(10)), 60, "s1")]
    cfg = small_config("pdd", router={"anomalous_max_output_tokens": 50})
    first, second = sorted(run(run_on_fake_wan(cfg, reqs))[0], key=lambda r: r["id"])
    assert first["pipeline"] == "rld-only" and first["status"] == "completed"
    decision = second["reports"]["router"]
    assert decision["router_hit_tokens"] >= 144 and decision["router_md_hit_tokens"] == 0
    assert second["p_hit_rate"] >= 0.9 and second["md_hit_rate"] == 0.0  # as the mirrors said
    assert second["pipeline"] == "p-rld-md", decision
    assert all(v.match for v in verify_records([first, second], cfg.model))


def test_a_turn_routed_while_md_still_receives_the_prefix_waits_for_it():
    """MD's DRC has a prefix only once its KV arrived: a next turn routed
    before that waits at MD for that transfer and fetches only the rest, and
    the router counts the prefix as MD's, starting the rest after it."""
    import random

    from testbed.pdd.roles.client_record import ClientRequest

    rng = random.Random(9)
    base = tuple(rng.randrange(512) for _ in range(128))
    # The second turn's 200 tokens take RLD ~1.8 s, far beyond the first turn's ~0.2 s
    # transfer even on a loaded machine: MD asks for the rest before the request ends
    # (with 60, a CI machine once saw RLD finish first, and MD never asked).
    reqs = [ClientRequest(0, 0.0, base, 60, "s1"),  # low hit: relay, WAN transfer ~0.2 s
            ClientRequest(1, 0.01, base + tuple(rng.randrange(512) for _ in range(8)), 200,
                          "s1")]
    first, second = sorted(run(run_on_fake_wan(small_config(), reqs))[0], key=lambda r: r["id"])
    assert first["pipeline"] == "p-rld-md"
    decision = second["reports"]["router"]
    assert decision["router_md_hit_tokens"] == 128 and decision["inflight_shared_tokens"] == 128
    assert second["md_hit_rate"] == 128 / 136
    assert second["reports"]["MD"]["inflight_shared_tokens"] == 128  # MD waited for it
    # the wait for the first turn's transfer is part of the predicted WAN time
    assert decision["predicted_kv_at_md_s"] >= first["reports"]["router"]["predicted_kv_at_md_s"]
    assert all(v.match for v in verify_records([first, second], small_config().model))


@pytest.mark.parametrize("handoff_mode", ["one-shot", "catch-up"])
def test_the_hash_engine_serves_every_pipeline_without_compute_overruns(handoff_mode):
    """engine hash: relayed requests (MD extends RLD's ids, then decodes) and requests
    that are not relayed, all exact (above); its real compute never outgrows the modeled."""
    records = records_of("pdd", handoff_mode, "hash")
    pipelines = {r["pipeline"] for r in records}
    assert "p-rld-md" in pipelines and pipelines & {"p-md", "rld-only"}, pipelines
    assert any(r["pipeline"] == "p-rld-md" and r["handoff"]["tokens"] > 0
               and "MD" in producers(r) for r in records)
    assert all(r["overruns"]["kv_bytes"] == 0 for r in records)
    steps = sum(r["overruns"]["steps"] for r in records)
    assert steps <= 0.02 * sum(r["max_out"] for r in records), steps


def test_verify_flags_a_wrong_handoff():
    """A relayed request whose MD part continued from a wrong handed-over id (or whose
    received tokens were altered) fails verification from MD's first token on."""
    from testbed.pdd.compute.engine import argmax, build_model

    cfg = config_of("pdd", "catch-up", "hash").model
    rec = next(r for r in records_of("pdd", "catch-up", "hash")
               if r["pipeline"] == "p-rld-md" and 2 <= r["handoff"]["tokens"] < r["max_out"])
    m, ids = rec["handoff"]["tokens"], [t[1] for t in rec["tokens"]]
    model = build_model(cfg)
    _, cache = model.prefill(rec["prompt"])
    wrong = ids[:m - 2] + [(ids[m - 2] + 1) % cfg.vocab_size, ids[m - 1]]
    tok, md = argmax(model.extend(cache, wrong)), []
    while len(md) < rec["max_out"] - m:
        md.append(tok)
        tok = argmax(model.decode_step(cache, tok))
    bad = dict(rec, tokens=[[p, t, 0.0, "RLD" if p < m else "MD"]
                            for p, t in enumerate(ids[:m] + md)])
    altered = dict(rec, tokens=[list(t) for t in rec["tokens"]])
    altered["tokens"][m][1] = (altered["tokens"][m][1] + 1) % cfg.vocab_size
    good, wrong_v, altered_v = verify_records([rec, bad, altered], cfg)
    assert good.match and good.first_mismatch is None
    assert not wrong_v.match and not wrong_v.prefix_ok and wrong_v.first_mismatch >= m
    assert sum(a != b for a, b in zip(md, ids[m:])) >= 0.9 * len(md)  # every later token
    assert (altered_v.match, altered_v.first_mismatch) == (False, m)
