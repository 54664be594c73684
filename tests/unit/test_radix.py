"""Block radix tree: match/insert/evict/pin tables, P-MD alignment, and prefix properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.pdd.compute.radix import RadixCache, common_prefix_len, common_prefix_of_keys, token_key

BS = 4


def seq(*blocks: int, tail: int = 0) -> list[int]:
    """Tokens made of whole blocks: block b is [b*10, b*10+1, ...]; ``tail`` extra tokens."""
    out = [b * 10 + i for b in blocks for i in range(BS)]
    return out + [999] * tail


@pytest.mark.parametrize("cached, query, hit", [
    ([], seq(1, 2), 0),
    ([seq(1, 2)], seq(1, 2), 8),
    ([seq(1, 2)], seq(1, 2, 3), 8),
    ([seq(1, 2)], seq(1), 4),
    ([seq(1, 2)], seq(1, tail=3), 4),           # partial block never matches
    ([seq(1, 2)], seq(2, 1), 0),
    ([seq(1, 2, tail=3)], seq(1, 2, 3), 8),     # partial block never cached
    ([seq(1, 2), seq(1, 3, 4)], seq(1, 3, 4, 5), 12),
    ([seq(1, 2), seq(1, 3, 4)], seq(1, 5), 4),
])
def test_match_table(cached, query, hit):
    tree = RadixCache(BS)
    for tokens in cached:
        tree.insert(tokens)
    assert tree.match(query).n_tokens == hit
    assert tree.lacks(query) == (hit, len(query))


def test_insert_returns_prior_and_keeps_first_values():
    tree = RadixCache(BS)
    assert tree.insert(seq(1, 2), ["a1", "a2"]) == 0
    assert tree.insert(seq(1, 2, 3), ["b1", "b2", "b3"]) == 8
    assert tree.match(seq(1, 2, 3)).values == ("a1", "a2", "b3")
    assert tree.cached_tokens == 12
    with pytest.raises(ValueError):
        tree.insert(seq(1), ["x", "y"])


def test_hit_rate_stats_and_read_only_lacks():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2, 3))
    tree.match(seq(1, 2, 3, 4))   # 12 / 16
    tree.match(seq(5, 6))         # 0 / 8
    tree.lacks(seq(1, 2, 3))      # not counted
    tree.match(seq(1, 2, 3), touch=False)  # not counted
    s = tree.stats
    assert (s.n_queries, s.query_tokens, s.hit_tokens) == (2, 24, 12)
    assert s.hit_rate == pytest.approx(0.5)
    assert s.inserted_tokens == 12 and s.evicted_tokens == 0


def test_lru_eviction_to_capacity():
    evicted = []
    tree = RadixCache(BS, capacity_tokens=16, on_evict=evicted.append)
    tree.insert(seq(1, 2), ["1", "2"])
    tree.insert(seq(3, 4), ["3", "4"])
    tree.match(seq(1, 2))                     # 1,2 now more recent than 3,4
    tree.insert(seq(5), ["5"])
    assert evicted == ["4"]                   # LRU leaf first
    assert tree.match(seq(3, 4)).n_tokens == 4
    tree.insert(seq(6, 7), ["6", "7"])
    assert evicted == ["4", "2", "1"]   # leaf 2 (LRU), which exposes 1, the next LRU
    assert tree.cached_tokens == 16 and tree.stats.evicted_tokens == 12


def test_pinned_prefix_survives_eviction():
    evicted = []
    tree = RadixCache(BS, capacity_tokens=16, on_evict=evicted.append)
    tree.insert(seq(1, 2), ["1", "2"])
    m = tree.match(seq(1, 2))
    tree.pin(m.handle)
    assert tree.pinned_tokens == 8
    tree.insert(seq(3, 4), ["3", "4"])
    tree.insert(seq(5, 6), ["5", "6"])        # must evict 3,4, not the pinned 1,2
    assert evicted == ["4", "3"]
    assert tree.match(seq(1, 2)).n_tokens == 8
    tree.unpin(m.handle)
    assert tree.pinned_tokens == 0
    assert tree.evict(8) == 8 and evicted[2:] == ["6", "5"]  # 5,6 older than 1,2 now
    with pytest.raises(ValueError):
        tree.unpin(m.handle)


def test_all_pinned_insert_caches_only_what_fits():
    tree = RadixCache(BS, capacity_tokens=12)
    tree.insert(seq(1, 2))
    tree.pin(tree.match(seq(1, 2)).handle)
    assert tree.insert(seq(3, 4, 5)) == 0
    assert tree.cached_tokens == 12 and tree.match(seq(3, 4, 5)).n_tokens == 4


def test_extending_a_prefix_never_evicts_that_prefix():
    tree = RadixCache(BS, capacity_tokens=12)
    tree.insert(seq(1, 2))
    tree.insert(seq(9))
    tree.match(seq(9))                      # 1,2 is now the LRU path
    tree.insert(seq(1, 2, 3))               # needs one block: evicts 9, not 2
    assert tree.match(seq(1, 2, 3)).n_tokens == 12
    assert tree.match(seq(9)).n_tokens == 0


def test_zero_capacity_caches_nothing():
    tree = RadixCache(BS, capacity_tokens=0)
    tree.insert(seq(1, 2))
    assert tree.cached_tokens == 0 and tree.match(seq(1, 2)).n_tokens == 0


@pytest.mark.parametrize("kwargs", [{"block_size": 0}, {"capacity_tokens": -1}])
def test_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        RadixCache(**kwargs)


# ---- properties ---------------------------------------------------------------

tokens_st = st.lists(st.integers(0, 2), max_size=24)  # small alphabet: many shared prefixes
ops_st = st.lists(st.tuples(st.sampled_from(["insert", "match"]), tokens_st), max_size=40)


def common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(ops=ops_st, block=st.integers(1, 5), cap=st.none() | st.integers(0, 40))
def test_match_never_exceeds_a_true_common_prefix(ops, block, cap):
    tree = RadixCache(block, capacity_tokens=cap)
    inserted: list[list[int]] = []
    for op, tokens in ops:
        if op == "insert":
            prefixes = [tuple(tokens[: (i + 1) * block]) for i in range(len(tokens) // block)]
            tree.insert(tokens, prefixes)
            inserted.append(tokens)
            continue
        m = tree.match(tokens)
        best = max((common_prefix(tokens, s) for s in inserted), default=0)
        assert m.n_tokens % block == 0 and m.n_tokens <= best
        if cap is None:  # nothing evicted: the match is exactly the best whole-block prefix
            assert m.n_tokens == best // block * block
        # each block's value is the prefix it stands for
        assert all(v == tuple(tokens[: (i + 1) * block]) for i, v in enumerate(m.values))
        if cap is not None:
            assert tree.cached_tokens <= cap // block * block


@settings(max_examples=200, deadline=None)
@given(ops=ops_st, cap=st.integers(0, 40))
def test_same_operations_give_same_tree(ops, cap):
    # P can mirror MD's DRC: same insert/match sequence -> same evictions -> same answers.
    md, mirror = RadixCache(BS, cap), RadixCache(BS, cap)
    for op, tokens in ops:
        getattr(md, op)(tokens)
        getattr(mirror, op)(tokens)
        assert md.lacks(tokens) == mirror.lacks(tokens)
        assert md.cached_tokens == mirror.cached_tokens
    assert md.stats == mirror.stats


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=700), st.lists(st.integers(0, 3), max_size=700),
       st.integers(0, 700))
def test_common_prefix_of_keys_is_common_prefix_len(a, tail, k):
    b = a[:k] + tail  # often a long shared run, then anything (or nothing)
    want = common_prefix_len(a, b)
    assert want == next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common_prefix_of_keys(token_key(a), token_key(b)) == want
    assert common_prefix_of_keys(token_key(b), token_key(a)) == want
