"""testbed.pdd.run.verify against the hash engine's greedy decode: exact tokens match,
a wrong one is found, and a request longer than the model's context (which the roles
reject) is judged on the positions the model can hold instead of crashing the check."""

from __future__ import annotations

from testbed.pdd.compute.engine import ModelConfig, build_model
from testbed.pdd.run.verify import verify_records

CFG = ModelConfig(engine="hash", max_context=256)


def record(prompt, max_out, tokens, status="completed"):
    return {"id": 1, "prompt": list(prompt), "max_out": max_out, "status": status,
            "tokens": [[p, t] for p, t in enumerate(tokens)]}


def test_exact_tokens_match_and_a_wrong_one_is_found():
    prompt = list(range(1, 41))
    ref = build_model(CFG).greedy_generate(prompt, 8)
    ok, = verify_records([record(prompt, 8, ref)], CFG)
    assert ok.match and ok.prefix_ok and ok.n_received == 8
    bad, = verify_records([record(prompt, 8, ref[:3] + [(ref[3] + 1) % 512] + ref[4:])], CFG)
    assert not bad.match and bad.first_mismatch == 3


def test_a_request_beyond_the_context_is_checked_where_the_model_can_go():
    prompt = list(range(1, 251))  # 250 of 256: room for 6 outputs, 20 asked
    rejected, = verify_records([record(prompt, 20, [], status="failed")], CFG)
    assert rejected.prefix_ok and not rejected.match and rejected.n_received == 0
    ref = build_model(CFG).greedy_generate(prompt, 6)
    beyond, = verify_records([record(prompt, 20, ref + [7], status="failed")], CFG)
    assert not beyond.prefix_ok and beyond.first_mismatch == 6  # no 7th token exists
    whole, = verify_records([record(list(range(300)), 4, [], status="failed")], CFG)
    assert whole.prefix_ok and whole.n_received == 0
