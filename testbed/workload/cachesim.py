"""Measured prefix hit rates: an unbounded block prefix cache replayed over the prompts.

Owns ``PrefixCacheSim`` and ``measure_hit_tokens``. This is how the prefill
role's radix cache (testbed.pdd.compute.radix, block size 16, never evicting) would
see a workload: prompts are inserted in arrival order; a prompt's hit is its
longest prefix of whole 16-token blocks that an earlier prompt already
inserted; a trailing partial block never hits and is never cached. Only
prompts are cached (P never sees the decoded output tokens).

A block is identified by hash((parent block's key, its 16 token IDs)), so
the cache is a set of ints instead of a tree of tuples (~60 bytes per cached
block). Two different prefixes colliding on a 64-bit hash is possible in
principle (~1e-7 for 10^6 blocks) and ignored. Statistics come from here,
never from the generator's designed numbers.

Example::

    measure_hit_tokens([[1] * 40, [1] * 40 + [2] * 8])    # [0, 32]
"""

from __future__ import annotations

from typing import Iterable, Sequence

BLOCK_TOKENS = 16


class PrefixCacheSim:
    """Unbounded block prefix cache: ``hit_then_insert(prompt)`` -> hit tokens."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS):
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self._keys: set[int] = set()

    @property
    def cached_tokens(self) -> int:
        return len(self._keys) * self.block_tokens

    def hit_then_insert(self, prompt: Sequence[int]) -> int:
        """Longest cached whole-block prefix of ``prompt``, then cache all its whole blocks."""
        bs, keys = self.block_tokens, self._keys
        prompt = tuple(prompt)
        key, hit, matching = 0, 0, True
        for start in range(0, len(prompt) - bs + 1, bs):
            key = hash((key, prompt[start:start + bs]))
            if matching and key in keys:
                hit += bs
            else:
                matching = False
                keys.add(key)
        return hit


def measure_hit_tokens(prompts: Iterable[Sequence[int]],
                       block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """Hit tokens of each prompt, replayed in the given (arrival) order."""
    sim = PrefixCacheSim(block_tokens)
    return [sim.hit_then_insert(p) for p in prompts]
