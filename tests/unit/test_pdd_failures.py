"""Failure semantics of docs/pdd-roles.md over the fake WAN: a role dies mid-request.

Every request must end ``completed`` or ``failed`` with a reason; a relayed
request survives the loss of MD before the final handoff (RLD finishes it)
and the loss of RLD (MD continues from the token ids RLD had emitted); a
request held by the lost decoder alone is re-served (P prefills prompt +
delivered tokens, the other decoder continues), each position once; a
restarted instance is used again.
"""

from __future__ import annotations

import random

from pdd_fixtures import producers, run, run_on_fake_wan, small_config

from testbed.impairment import LinkSpec
from testbed.pdd.roles.client_record import ClientRequest
from testbed.pdd.run.verify import verify_records

rng = random.Random(5)
RELAYED = ClientRequest(0, 0.0, tuple(rng.randrange(512) for _ in range(128)), 100, "a")
P_MD = ClientRequest(1, 0.0, tuple(rng.randrange(512) for _ in range(20)), 30, "b")
ANOMALOUS = ClientRequest(2, 0.0, tuple(rng.randrange(512) for _ in range(150)), 200, "c")


def kill(name):
    async def action(handles):
        await handles.kill(name)
    return action


def assert_all_terminal_with_reasons(records):
    for r in records:
        assert r["status"] in ("completed", "failed")
        assert (r["status"] == "failed") == (r["reason"] is not None), r


def test_md_lost_before_the_final_handoff_rld_finishes_the_request():
    cfg = small_config("pdd", "catch-up")
    # MD dies at 0.12 s: the relayed request's KV is still crossing the WAN
    records, _ = run(run_on_fake_wan(cfg, [RELAYED, P_MD], [(0.12, kill("md0"))]))
    assert_all_terminal_with_reasons(records)
    relayed, p_md = records
    assert relayed["status"] == "completed" and relayed["pipeline"] == "p-rld-md->rld"
    assert set(producers(relayed)) == {"RLD"} and len(relayed["tokens"]) == 100
    assert verify_records([relayed], cfg.model)[0].match
    # MD held the p-md request alone: re-served on RLD from the tokens delivered
    assert p_md["status"] == "completed", p_md["reason"]
    assert p_md["pipeline"] == "p-md->re-served-rld-only"
    reserve = p_md["reports"]["router"]["reserves"][0]["reserve"]
    who = producers(p_md)
    assert who == ["MD"] * reserve["from_position"] + ["RLD"] * (30 - reserve["from_position"])
    assert verify_records([p_md], cfg.model)[0].match


def test_md_lost_mid_decode_the_request_continues_on_rld_each_position_once():
    cfg = small_config("pdd", "one-shot")
    late = ClientRequest(1, 0.0, P_MD.prompt, 200, "b")
    records, _ = run(run_on_fake_wan(cfg, [late], [(0.4, kill("md0"))]))
    r = records[0]
    assert r["status"] == "completed", r["reason"]
    who = producers(r)
    m = who.count("MD")
    assert 0 < m < 200 and who == ["MD"] * m + ["RLD"] * (200 - m)
    assert r["tokens_duplicated"] == 0 and verify_records([r], cfg.model)[0].match


def test_without_a_second_decoder_a_request_on_the_lost_md_fails_with_a_reason():
    cfg = small_config("cross-dc-pd")
    records, _ = run(run_on_fake_wan(cfg, [P_MD], [(0.12, kill("md0"))]))
    assert records[0]["status"] == "failed"
    assert "MAIN_DECODE lost" in records[0]["reason"]
    assert "one decoder only" in records[0]["reason"]


def test_while_md_is_down_requests_go_to_rld_and_a_restarted_md_is_used_again():
    cfg = small_config("pdd", "one-shot")

    async def restart(handles):
        await handles.restart("md0")

    anchor = ClientRequest(2, 0.0, P_MD.prompt[:10], 2, "z")  # the client's time 0
    during = ClientRequest(3, 0.3, P_MD.prompt, 30, "d")
    after = ClientRequest(4, 2.0, RELAYED.prompt[:40], 30, "e")
    records, _ = run(run_on_fake_wan(cfg, [anchor, during, after], [(0.05, kill("md0")),
                                                                    (0.8, restart)]))
    assert_all_terminal_with_reasons(records)
    assert records[0]["status"] == "completed", records[0]["reason"]
    d, a = records[1:]
    assert d["status"] == "completed" and d["pipeline"] == "rld-only"
    assert "MAIN_DECODE down" in d["reports"]["router"]["reason"]
    assert a["status"] == "completed" and "MD" in producers(a)
    assert verify_records(records, cfg.model)[0].match


def test_rld_lost_md_continues_from_the_token_ids_rld_had_emitted():
    cfg = small_config("pdd", "one-shot")
    # RLD dies at 0.12 s: it has streamed ~10 eager tokens, MD has no KV yet
    records, _ = run(run_on_fake_wan(cfg, [RELAYED, ANOMALOUS], [(0.12, kill("rld0"))]))
    assert_all_terminal_with_reasons(records)
    relayed, anomalous = records
    assert relayed["status"] == "completed", relayed["reason"]
    who = producers(relayed)
    m = who.count("RLD")
    assert m > 0 and who == ["RLD"] * m + ["MD"] * (100 - m)
    assert verify_records([relayed], cfg.model)[0].match
    # the anomalous request was RLD's alone: re-served on MD (p-md) from what it had
    assert anomalous["status"] == "completed", anomalous["reason"]
    assert anomalous["pipeline"] == "rld-only->re-served-p-md"
    who = producers(anomalous)
    m = who.count("RLD")
    assert who == ["RLD"] * m + ["MD"] * (200 - m)
    assert verify_records([anomalous], cfg.model)[0].match


def test_requests_that_cannot_finish_in_time_fail_with_a_timeout():
    cfg = small_config("cross-dc-pd", client={"request_timeout_s": 0.3, "report_grace_s": 0.2})
    slow_wan = LinkSpec(rate_gbit=1000, delay_ms=400)
    records, handles = run(run_on_fake_wan(cfg, [RELAYED, P_MD], wan=slow_wan))
    assert [r["status"] for r in records] == ["failed", "failed"]
    assert all(r["reason"].startswith("timeout") for r in records)


def test_rejected_and_rld_finished_requests_end_cleanly():
    # late_kv_local off: the router would keep this short request's KV local
    # (test below); here RLD must finish a relayed request before MD has its KV
    cfg = small_config("pdd", router={"late_kv_local": False})
    too_long = ClientRequest(5, 0.0, (1,) * 4000, 200, "x")  # 4200 > max_context 4096
    short_relayed = ClientRequest(6, 0.0, RELAYED.prompt, 8, "y")  # done before MD has the KV
    records, _ = run(run_on_fake_wan(cfg, [too_long, P_MD, short_relayed]))
    assert records[0]["status"] == "failed" and "rejected" in records[0]["reason"]
    assert records[1]["status"] == "completed"
    short = records[2]
    assert short["status"] == "completed" and short["pipeline"] == "p-rld-md"
    assert producers(short) == ["RLD"] * 8 and short["handoff"]["batches"] == 0
    assert short["reports"]["MD"]["cancelled"] is True  # the router told MD to drop it


def test_a_request_rld_finishes_before_its_kv_could_reach_md_stays_local():
    short_relayed = ClientRequest(6, 0.0, RELAYED.prompt, 8, "y")
    records, _ = run(run_on_fake_wan(small_config("pdd"), [short_relayed]))
    r = records[0]
    assert r["status"] == "completed" and r["pipeline"] == "rld-only"
    assert "after RLD's last token" in r["reports"]["router"]["reason"]
    assert producers(r) == ["RLD"] * 8 and r["bytes"]["kv_wan"] == 0


def test_while_rld_is_down_new_requests_go_p_md():
    cfg = small_config("pdd", "one-shot")
    anchor = ClientRequest(2, 0.0, P_MD.prompt[:10], 2, "z")
    late = ClientRequest(7, 0.3, RELAYED.prompt, 60, "r")  # would be relayed
    records, _ = run(run_on_fake_wan(cfg, [anchor, late], [(0.05, kill("rld0"))]))
    assert_all_terminal_with_reasons(records)
    r = records[1]
    assert r["status"] == "completed" and r["pipeline"] == "p-md", r["reason"]
    assert "no live RELAY_DECODE" in r["reports"]["router"]["reason"]
    assert set(producers(r)) == {"MD"} and verify_records([r], cfg.model)[0].match
