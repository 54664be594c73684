"""The tiny decoder: shapes, seeded weights, KV wire format, and exact greedy-token equality
across the four ways PDD produces a request's tokens (plain, prefill+decode, shipped KV,
extend-decode handoff)."""

from __future__ import annotations

import random

import pytest
import torch

from testbed.errors import ProtocolError
from testbed.pdd.compute.model import KVCache, ModelConfig, argmax, build_model, set_threads

SMALL = ModelConfig(n_layer=2, n_head=4, d_model=64, max_context=512, seed=3)
N_GEN = 64  # tokens checked against the reference for every prompt
N_TAIL = 24  # tokens decoded after a prefix prefill, a KV shipment or an extend
EXTEND_SIZES = (1, 7, 64, 100)


@pytest.fixture(scope="module")
def model():
    set_threads(1)
    return build_model(SMALL)


@pytest.fixture(scope="module")
def cases(model):
    """20 random prompts of 1..300 tokens and their greedy continuation (prefill + decode)."""
    rng = random.Random(42)
    lengths = [1, 2, 15, 16, 17, 300] + [rng.randint(1, 300) for _ in range(14)]
    out = []
    for n in lengths:
        prompt = [rng.randrange(SMALL.vocab_size) for _ in range(n)]
        out.append((prompt, model.greedy_generate(prompt, max(EXTEND_SIZES) + N_TAIL)))
    return out


def decode_from(model, cache, logits, n):
    """Greedy tokens continuing from ``logits`` on ``cache`` (the b/c/d paths' tail)."""
    toks = []
    while True:
        toks.append(argmax(logits))
        if len(toks) == n:
            return toks
        logits = model.decode_step(cache, toks[-1])


def test_shapes(model):
    prompt = list(range(10))
    logits, cache = model.prefill(prompt)
    hs = SMALL.d_model // SMALL.n_head
    assert logits.shape == (SMALL.vocab_size,)
    assert cache.length == 10 and cache.start == 0 and cache.tokens == prompt
    assert cache.keys(0).shape == (SMALL.n_head, 10, hs)
    assert cache.values(SMALL.n_layer - 1).shape == (SMALL.n_head, 10, hs)
    assert model.decode_step(cache, 5).shape == (SMALL.vocab_size,)
    assert model.extend(cache, [1, 2, 3]).shape == (SMALL.vocab_size,)
    assert cache.length == 14
    assert model.score(prompt).shape == (10, SMALL.vocab_size)
    assert cache.nbytes_per_token == 2 * SMALL.n_layer * SMALL.d_model * 8  # float64


def test_default_config_is_nanogpt_sized():
    cfg = ModelConfig()
    assert (cfg.vocab_size, cfg.n_layer, cfg.n_head, cfg.d_model) == (512, 4, 4, 256)
    assert cfg.max_context >= 4096 and cfg.dtype == "float64"
    with pytest.raises(ValueError):
        ModelConfig(d_model=250, n_head=4)
    with pytest.raises(ValueError):
        ModelConfig(dtype="bfloat16")


def test_same_seed_same_weights_other_seed_other_weights():
    a, b = build_model(SMALL), build_model(SMALL)
    c = build_model(ModelConfig(**{**SMALL.__dict__, "seed": 4}))
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(),
                                  c.state_dict().values()):
        assert torch.equal(pa, pb), name
        if "ln" not in name:
            assert not torch.equal(pa, pc), name


def test_output_depends_on_whole_prompt(model, cases):
    # Guards the equality tests against a degenerate model: changing the first
    # prompt token must change the continuation of long prompts.
    long = [(p, ref) for p, ref in cases if len(p) >= 100]
    changed = sum(model.greedy_generate([(p[0] + 1) % 512] + p[1:], N_TAIL) != ref[:N_TAIL]
                  for p, ref in long)
    assert changed >= 0.75 * len(long)
    assert all(len(set(ref)) > 10 for _, ref in cases)


def test_a_plain_generate_equals_prefill_decode(model, cases):
    # Fully independent of the KV cache: recompute everything for every token.
    for prompt, ref in cases[:6]:
        assert model.greedy_generate(prompt, 24, use_cache=False) == ref[:24]


def test_a_teacher_forced_full_pass_equals_prefill_decode(model, cases):
    # One causal pass over prompt + output must pick every output token.
    for prompt, ref in cases:
        seq = prompt + ref[:N_GEN]
        picks = model.score(seq)[len(prompt) - 1 : -1].argmax(-1).tolist()
        assert picks == ref[:N_GEN]


def test_b_prefill_on_prefix_cache_equals_full_prefill(model, cases):
    for prompt, ref in cases:
        cut = len(prompt) // 2
        _, cache = model.prefill(prompt[:cut]) if cut else (None, model.new_cache())
        logits, cache = model.prefill(prompt, cache)
        assert decode_from(model, cache, logits, N_TAIL) == ref[:N_TAIL]


def test_b_prefill_chunk_size_does_not_change_tokens(cases):
    # SMALL prefills in chunks of 128; one pass and tiny chunks must agree.
    for chunk in (7, 4096):
        m = build_model(ModelConfig(**{**SMALL.__dict__, "prefill_chunk": chunk}))
        for prompt, ref in cases[5:9]:
            logits, cache = m.prefill(prompt)
            assert decode_from(m, cache, logits, N_TAIL) == ref[:N_TAIL]


def test_b_prefill_of_fully_cached_prompt_recomputes_last_token(model, cases):
    prompt, ref = cases[5]
    _, cache = model.prefill(prompt)
    logits, cache = model.prefill(prompt, cache)
    assert cache.length == len(prompt) and argmax(logits) == ref[0]


def test_b_prefill_rejects_cache_of_other_tokens(model):
    _, cache = model.prefill([1, 2, 3])
    with pytest.raises(ValueError):
        model.prefill([1, 9, 3, 4], cache)


def test_c_decode_continues_from_shipped_kv_bytes(model, cases):
    for prompt, ref in cases:
        logits, p_cache = model.prefill(prompt)
        md_cache = KVCache.from_bytes(p_cache.to_bytes())
        assert decode_from(model, md_cache, logits, N_GEN) == ref[:N_GEN]


def test_c_only_missing_suffix_shipped_onto_md_prefix(model, cases):
    # DRC: MD already holds a prefix; P ships only [hit, end).
    for prompt, ref in cases:
        hit = len(prompt) * 3 // 4
        _, md_cache = model.prefill(prompt[:hit]) if hit else (None, model.new_cache())
        logits, p_cache = model.prefill(prompt)
        md_cache.append(KVCache.from_bytes(p_cache.to_bytes(hit, p_cache.end)))
        assert md_cache.tokens == prompt
        assert decode_from(model, md_cache, logits, N_TAIL) == ref[:N_TAIL]


@pytest.mark.parametrize("n_relay", EXTEND_SIZES)
def test_d_md_extend_of_relay_tokens_then_decode(model, cases, n_relay):
    for prompt, ref in cases:
        # RLD decoded ref[:n_relay] from P's KV (that prefill + decode yields
        # ref is what the fixture and test_c check) and hands over only the ids.
        relay = ref[:n_relay]
        # MD: has only the prompt's KV (shipped over the WAN), recomputes the rest.
        _, p_cache = model.prefill(prompt)
        md_cache = KVCache.from_bytes(p_cache.to_bytes(0, len(prompt)))
        logits = model.extend(md_cache, relay)
        tail = decode_from(model, md_cache, logits, N_TAIL)
        assert relay + tail == ref[: n_relay + N_TAIL]


def test_d_catch_up_handoff_in_several_batches(model, cases):
    # Catch-up mode: MD extends batch after batch while RLD keeps decoding.
    for prompt, ref in cases[:8]:
        _, md_cache = model.prefill(prompt)
        handed = 0
        for batch in (40, 25, 10, 3):
            logits = model.extend(md_cache, ref[handed : handed + batch])
            handed += batch
            assert argmax(logits) == ref[handed]
        assert handed + len(decode_from(model, md_cache, logits, 20)) == handed + 20
        assert md_cache.tokens == prompt + ref[:handed + 19]


def test_kv_bytes_round_trip_is_exact(model, cases):
    prompt, _ = cases[5]
    _, cache = model.prefill(prompt)
    for start, end in [(0, cache.end), (17, 200), (0, 0), (cache.end, cache.end)]:
        seg = KVCache.from_bytes(cache.to_bytes(start, end))
        assert (seg.start, seg.end, seg.tokens) == (start, end, prompt[start:end])
        for i in range(SMALL.n_layer):
            assert torch.equal(seg.keys(i), cache.keys(i)[:, start:end])
            assert torch.equal(seg.values(i), cache.values(i)[:, start:end])
        assert len(cache.to_bytes(start, end)) - len(cache.to_bytes(start, start)) == (
            (end - start) * (cache.nbytes_per_token + 4))


def test_append_truncate_slice(model):
    _, cache = model.prefill(list(range(40)))
    head, tail = cache.slice(0, 25), cache.slice(25, 40)
    with pytest.raises(ValueError):
        head.append(cache.slice(26, 40))  # gap
    head.append(tail)
    assert head.tokens == cache.tokens and torch.equal(head.keys(1), cache.keys(1))
    head.truncate(10)
    assert head.length == 10 and head.keys(0).shape[1] == 10
    with pytest.raises(ValueError):
        head.truncate(11)
    with pytest.raises(ValueError):
        cache.slice(30, 41)
    with pytest.raises(ValueError):
        model.decode_step(tail, 1)  # a segment not starting at 0 cannot be run


@pytest.mark.parametrize("mangle", [
    lambda b: b[:10],                     # shorter than the header
    lambda b: b"XXXX" + b[4:],            # bad magic
    lambda b: b[:-1],                     # truncated payload
    lambda b: b + b"\0",                  # trailing garbage
])
def test_malformed_kv_bytes_raise_protocol_error(model, mangle):
    _, cache = model.prefill(list(range(20)))
    with pytest.raises(ProtocolError):
        KVCache.from_bytes(mangle(cache.to_bytes()))


def test_bad_inputs_are_rejected():
    m = build_model(ModelConfig(n_layer=1, n_head=2, d_model=16, vocab_size=32, max_context=8))
    _, cache = m.prefill(list(range(8)))
    with pytest.raises(ValueError):
        m.decode_step(cache, 1)  # past max_context
    with pytest.raises(ValueError):
        m.prefill([])
    for bad in ([32], [-1]):
        with pytest.raises(ValueError):
            m.prefill(bad)
    with pytest.raises(ValueError):
        m.extend(m.new_cache(), [])


def test_float32_option_runs():
    m = build_model(ModelConfig(n_layer=1, n_head=2, d_model=16, dtype="float32"))
    logits, cache = m.prefill([1, 2, 3])
    assert logits.dtype == torch.float32 and cache.nbytes_per_token == 2 * 16 * 4
    assert KVCache.from_bytes(cache.to_bytes()).dtype == torch.float32
