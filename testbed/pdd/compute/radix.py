"""Block radix tree for prefix caching: P's prefix cache and MD's decode-side RadixCache (DRC).

This module owns which token prefixes a role holds. Tokens are cached in
whole blocks of ``block_size`` tokens (a trailing partial block is never
cached); each tree node is one block, keyed by its token tuple under its
parent, and may carry a value (e.g. the block's KV slot or KV bytes).

Lifecycle of a prefix:
    insert(tokens, values)  -> blocks added (their tick = now)
    match(tokens)           -> longest cached whole-block prefix; refreshes LRU
    pin(handle) / unpin     -> in-use prefixes are never evicted
    eviction                -> least recently used unpinned leaf block first,
                               whenever an insert would exceed capacity_tokens
                               (or on ``evict(n)``); ``on_evict(value)`` is called.

P and MD alignment. P must send MD only the KV MD lacks. Two ways, both
supported: (1) ``lacks(tokens)`` is a read-only query MD answers (it changes
neither LRU order nor statistics), P then ships ``[start, end)``; (2) time is
a logical counter (one tick per match/insert), ties broken by creation order,
so two trees fed the same operation sequence evict the same blocks and P can
keep a faithful mirror of MD's tree without asking.
"""

from __future__ import annotations

import heapq
import itertools
import struct
from dataclasses import dataclass
from typing import Any, Callable, Sequence


class _Node:
    """One cached block. ``ref`` counts pins of this node or any descendant."""

    __slots__ = ("key", "parent", "children", "value", "ref", "tick", "seq")

    def __init__(self, key: tuple[int, ...], parent: _Node | None, value: Any, seq: int):
        self.key, self.parent, self.value, self.seq = key, parent, value, seq
        self.children: dict[tuple[int, ...], _Node] = {}
        self.ref = 0
        self.tick = 0


Handle = _Node  # opaque: the deepest node of a matched prefix


@dataclass(frozen=True)
class Match:
    """Result of ``match``: a cached prefix of ``n_tokens`` tokens (a block multiple)."""

    n_tokens: int
    handle: Handle
    values: tuple[Any, ...]  # one per cached block, root-side first


@dataclass(frozen=True)
class RadixStats:
    """Counters since creation; ``hit_rate`` is hit tokens over queried tokens of ``match``."""

    n_queries: int
    query_tokens: int
    hit_tokens: int
    inserted_tokens: int
    evicted_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class RadixCache:
    """A block radix tree with pinning and deterministic LRU eviction.

    Example::

        tree = RadixCache(block_size=4, capacity_tokens=1024)
        tree.insert([1, 2, 3, 4, 5, 6, 7, 8, 9])      # caches 8 tokens (2 blocks)
        m = tree.match([1, 2, 3, 4, 5, 6, 7, 0])      # m.n_tokens == 4
        tree.pin(m.handle); ...; tree.unpin(m.handle)
    """

    def __init__(self, block_size: int = 16, capacity_tokens: int | None = None,
                 on_evict: Callable[[Any], None] | None = None):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        self.block_size, self.capacity_tokens = block_size, capacity_tokens
        self._on_evict = on_evict
        self._seq = itertools.count(1)
        self._root = _Node((), None, None, 0)
        self._tick = 0
        self._n_blocks = 0
        self._heap: list[tuple[int, int, _Node]] = []  # (tick, seq, leaf); stale entries skipped
        self._counts = {"n_queries": 0, "query_tokens": 0, "hit_tokens": 0,
                        "inserted_tokens": 0, "evicted_tokens": 0}

    # -- queries ---------------------------------------------------------
    @property
    def cached_tokens(self) -> int:
        return self._n_blocks * self.block_size

    @property
    def pinned_tokens(self) -> int:
        return self._count_pinned(self._root) * self.block_size

    @property
    def stats(self) -> RadixStats:
        return RadixStats(**self._counts)

    def _blocks(self, tokens: Sequence[int]) -> list[tuple[int, ...]]:
        bs = self.block_size
        return [tuple(tokens[i : i + bs]) for i in range(0, len(tokens) // bs * bs, bs)]

    def _walk(self, tokens: Sequence[int]) -> list[_Node]:
        """Nodes of the longest cached whole-block prefix of tokens, root excluded."""
        path, node = [], self._root
        for key in self._blocks(tokens):
            node = node.children.get(key)
            if node is None:
                break
            path.append(node)
        return path

    def match(self, tokens: Sequence[int], *, touch: bool = True) -> Match:
        """Longest cached prefix; ``touch`` refreshes its LRU time and counts stats.

        Example: ``tree.match(prompt).n_tokens`` is the prefix-cache hit.
        """
        path = self._walk(tokens)
        n = len(path) * self.block_size
        if touch:
            self._touch(path)
            self._counts["n_queries"] += 1
            self._counts["query_tokens"] += len(tokens)
            self._counts["hit_tokens"] += n
        return Match(n, path[-1] if path else self._root, tuple(p.value for p in path))

    def lacks(self, tokens: Sequence[int]) -> tuple[int, int]:
        """Read-only: the token range ``[start, len(tokens))`` this tree does not hold.

        Example: MD answers ``tree.lacks(prompt)``; P ships ``kv.to_bytes(*tree.lacks(prompt))``.
        """
        return len(self._walk(tokens)) * self.block_size, len(tokens)

    # -- updates ---------------------------------------------------------
    def insert(self, tokens: Sequence[int], values: Sequence[Any] | None = None) -> int:
        """Cache the whole blocks of tokens; return how many tokens were already cached.

        ``values`` gives one value per whole block (``len(tokens) // block_size``);
        values of blocks already cached are not stored (the caller frees them).
        Blocks that do not fit after evicting every unpinned block are not cached.
        Example: ``prior = tree.insert(prompt, kv_slots)``.
        """
        keys = self._blocks(tokens)
        if values is not None and len(values) != len(keys):
            raise ValueError(f"{len(keys)} whole blocks but {len(values)} values")
        path = self._walk(tokens)
        prior = len(path)
        self._touch(path)
        node = path[-1] if path else self._root
        self._pin_node(node)  # the prefix we extend must survive making room
        try:
            room = self._make_room(len(keys) - prior)
            for i in range(prior, prior + room):
                child = _Node(keys[i], node, None if values is None else values[i], next(self._seq))
                child.tick = self._tick
                node.children[keys[i]] = child
                node = child
            self._n_blocks += room
            self._counts["inserted_tokens"] += room * self.block_size
        finally:
            self._unpin_node(path[-1] if path else self._root)
        self._push_if_leaf(node)
        return prior * self.block_size

    def pin(self, handle: Handle) -> None:
        """Protect the prefix ending at ``handle`` from eviction (counted; unpin as often)."""
        self._pin_node(handle)

    def unpin(self, handle: Handle) -> None:
        self._unpin_node(handle)
        self._push_if_leaf(handle)

    def evict(self, n_tokens: int) -> int:
        """Evict LRU unpinned blocks until n_tokens are freed (or none is left); return freed."""
        need = -(-n_tokens // self.block_size)
        freed = 0
        while freed < need and self._evict_one():
            freed += 1
        return freed * self.block_size

    # -- internals -------------------------------------------------------
    def _touch(self, path: list[_Node]) -> None:
        self._tick += 1
        for node in path:
            node.tick = self._tick
        if path:
            self._push_if_leaf(path[-1])

    def _pin_node(self, node: _Node) -> None:
        while node is not None:
            node.ref += 1
            node = node.parent

    def _unpin_node(self, node: _Node) -> None:
        if node.ref <= 0:
            raise ValueError("unpin of a prefix that is not pinned")
        while node is not None:
            node.ref -= 1
            node = node.parent

    def _push_if_leaf(self, node: _Node) -> None:
        if node is not self._root and not node.children and node.ref == 0:
            heapq.heappush(self._heap, (node.tick, node.seq, node))
            if len(self._heap) > 4 * self._n_blocks + 64:
                self._heap = [e for e in self._heap if self._evictable(e)]
                heapq.heapify(self._heap)

    def _evictable(self, entry: tuple[int, int, _Node]) -> bool:
        tick, _, node = entry
        return (node.parent is not None and node.tick == tick and not node.children
                and node.ref == 0 and node.parent.children.get(node.key) is node)

    def _evict_one(self) -> bool:
        while self._heap:
            entry = heapq.heappop(self._heap)
            if not self._evictable(entry):
                continue
            node = entry[2]
            parent = node.parent
            del parent.children[node.key]
            node.parent = None
            self._n_blocks -= 1
            self._counts["evicted_tokens"] += self.block_size
            if self._on_evict is not None:
                self._on_evict(node.value)
            self._push_if_leaf(parent)
            return True
        return False

    def _make_room(self, n_blocks: int) -> int:
        """Evict until n_blocks more fit under capacity; return how many fit."""
        if self.capacity_tokens is None:
            return n_blocks
        cap = self.capacity_tokens // self.block_size
        while self._n_blocks + n_blocks > cap and self._evict_one():
            pass
        return max(0, min(n_blocks, cap - self._n_blocks))

    def _count_pinned(self, root: _Node) -> int:
        count, stack = 0, [c for c in root.children.values() if c.ref > 0]
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(c for c in node.children.values() if c.ref > 0)
        return count


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common leading run of two token sequences: ``common_prefix_len(ab, ac) == 1``.

    For one comparison. Code that compares one prompt with many keeps their
    ``token_key`` and calls ``common_prefix_of_keys`` (~3 us for 2048 tokens instead of
    ~50 us: a byte comparison instead of one Python int comparison per token)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


_KEY_ITEM = struct.Struct("q")


def token_key(tokens: Sequence[int]) -> bytes:
    """``tokens`` as bytes (8 per token) for ``common_prefix_of_keys``."""
    return struct.pack(f"{len(tokens)}q", *tokens)


def common_prefix_of_keys(a: bytes, b: bytes) -> int:
    """``common_prefix_len`` of the token sequences behind two ``token_key`` results:
    whole 2 KB slices compared while they match, then the first differing one bisected
    (each comparison a memcmp), in whole tokens."""
    n = min(len(a), len(b))
    lo = 0
    while lo < n and a[lo:lo + _KEY_CHUNK] == b[lo:lo + _KEY_CHUNK]:
        lo += _KEY_CHUNK
    if lo >= n:
        return n // _KEY_ITEM.size
    hi = min(lo + _KEY_CHUNK, n)
    if a[lo:hi] == b[lo:hi]:  # the chunk differs only in length: equal to the shorter's end
        return hi // _KEY_ITEM.size
    while hi - lo > 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo // _KEY_ITEM.size


_KEY_CHUNK = 2048
