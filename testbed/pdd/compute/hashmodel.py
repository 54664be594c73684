"""The model-free "hash" engine: the roles' tokens from a 64-bit hash chain, no torch.

Owns ``HashDecoder`` (the TinyDecoder interface: ``new_cache``, ``prefill``,
``decode_step``, ``extend``, ``score``, ``greedy_generate``, ``cfg``), its
per-request cache ``HashCache`` (the KVCache interface: ``start``, ``end``,
``length``, ``tokens``, ``n_layer``, ``nbytes_per_token``, ``append``,
``truncate``, ``slice``, ``to_bytes``, ``from_bytes``) and its "logits"
``HashLogits`` (the next token itself). Chosen per scenario with
``ModelConfig.engine = "hash"`` when the torch decoder's real compute would
overrun the modeled time on a small machine (docs/pdd-roles.md, "Compute
engines").

The chain. Position i (token t_i) has a 64-bit state, its "KV"::

    s_i   = mix(s_{i-1} ^ mix(key ^ (i << 32 | t_i)))     s_{-1} = mix(seed)
    acc_i = (acc_{i-1} + s_i) mod 2^64                     acc_{-1} = 0
    next token after position i = mix(s_i ^ (acc_i * C)) mod vocab_size

with ``mix`` splitmix64's finalizer (a bijection of 64-bit words with full
avalanche). So the next token is a function of the whole prefix: a wrong
token or a wrong position anywhere changes s from there on, and through the
running sum every state the cache holds counts, including those it received
(a wrong KV segment, or one from another prefix, changes every later token,
as wrong attention keys would). ``acc`` is derived locally from the states,
never shipped. ``extend`` (MD's recompute of handed-over ids) computes
states from the token ids and the last state, trusting nothing shipped with
the ids.

The wire (a KV_CHUNK's data, ``to_bytes``)::

    <4sBQqq  magic b"KVH\\0", version 1, key (the seed's s_{-1}), start, count
    <i4 x count   token ids
    <u8 x count   states

``from_bytes`` raises ProtocolError on a malformed payload or on the torch
engine's (magic b"KVC\\0"); ``append`` refuses another seed's segment.

Example::

    model = HashDecoder(ModelConfig(engine="hash"))
    logits, cache = model.prefill([1, 2, 3])        # P
    md = HashCache.from_bytes(cache.to_bytes())      # the KV over the wire
    tok = model.extend(md, [logits.token]).token     # MD recomputes a handed-over id

Speed, microseconds per token (``python -m testbed.bench.engine_bench``, run
once on 2026-12-04, 2-core Debian 12 VM shared with another job, load average
~2.6; torch = the default ModelConfig, float64, one thread)::

    engine  context  decode_step  prefill  extend (100 ids)
    torch       100         3278      221      223
    torch      2000         9527      597      569
    hash        100          2.5      0.8      0.8
    hash       2000          2.7      0.8      0.9

So a hash decode step costs ~1/1300-1/3500 of a torch one and does not grow
with the context (the unit tests' modeled GPU_A decode step is ~9 ms at time_scale 0.5).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from testbed.errors import ProtocolError
from testbed.pdd.compute.cachebase import TokenSpan, split_prefill

if TYPE_CHECKING:
    from testbed.pdd.compute.engine import ModelConfig

_M = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_OUT_MUL = 0xD6E8FEB86659FD93
_HEADER = struct.Struct("<4sBQqq")  # magic, version, key, start, count
MAGIC, _VERSION = b"KVH\x00", 1
STATE_BYTES = 8  # one u64 state per position


def mix(z: int) -> int:
    """splitmix64's finalizer of a 64-bit word, e.g. ``mix(1)``."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
    return z ^ (z >> 31)


@dataclass(frozen=True, slots=True)
class HashLogits:
    """What the hash engine returns where torch returns logits: the greedy next token
    (``engine.argmax`` gives ``token``)."""

    token: int


class HashCache(TokenSpan):
    """The states of a contiguous token range [start, end), one u64 per position.

    A cache the model runs on starts at position 0; one with ``start > 0`` is a
    segment (``slice``, ``from_bytes``), to be ``append``-ed onto a cache ending
    where it starts. ``key`` names the seed whose chain the states belong to.
    """

    n_layer = 1  # KV_CHUNK's layer range: the state is one "layer"
    nbytes_per_token = STATE_BYTES

    def __init__(self, key: int, start: int = 0):
        self.key, self.start = key, start
        self.tokens: list[int] = []
        self.states: list[int] = []
        self._acc: list[int] = []  # running sums of states[:len(_acc)] (start 0 only)

    def append(self, other: HashCache) -> None:
        """Append a segment starting where this cache ends, e.g.
        ``cache.append(HashCache.from_bytes(wire))``."""
        if not isinstance(other, HashCache):
            raise ValueError(f"a {type(other).__name__} segment cannot join a hash cache")
        if other.start != self.end:
            raise ValueError(f"segment starts at {other.start}, cache ends at {self.end}")
        if other.key != self.key:
            raise ValueError(f"segment of hash key {other.key:#x}, cache of {self.key:#x} "
                             "(another seed)")
        self.tokens.extend(other.tokens)
        self.states.extend(other.states)

    def truncate(self, n: int) -> None:
        """Keep only the first n tokens, e.g. ``c.truncate(len(prompt))``."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate {self.length} tokens to {n}")
        del self.tokens[n:], self.states[n:], self._acc[n:]

    def _range(self, start: int | None, end: int | None) -> tuple[int, int]:
        start = self.start if start is None else start
        end = self.end if end is None else end
        if not self.start <= start <= end <= self.end:
            raise ValueError(f"range [{start}, {end}) outside [{self.start}, {self.end})")
        return start - self.start, end - self.start

    def slice(self, start: int, end: int) -> HashCache:
        """Copy of absolute positions [start, end), e.g. ``c.slice(hit, c.end)``."""
        lo, hi = self._range(start, end)
        seg = HashCache(self.key, start)
        seg.tokens, seg.states = self.tokens[lo:hi], self.states[lo:hi]
        return seg

    def to_bytes(self, start: int | None = None, end: int | None = None) -> bytearray:
        """Serialize positions [start, end) (default: all), e.g. ``c.to_bytes(512, c.end)``."""
        lo, hi = self._range(start, end)
        n = hi - lo
        out = bytearray(_HEADER.size + n * (4 + STATE_BYTES))
        _HEADER.pack_into(out, 0, MAGIC, _VERSION, self.key, self.start + lo, n)
        struct.pack_into(f"<{n}i{n}Q", out, _HEADER.size, *self.tokens[lo:hi],
                         *self.states[lo:hi])
        return out

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> HashCache:
        """Rebuild a segment from ``to_bytes`` output; raises ProtocolError if malformed."""
        if len(data) < _HEADER.size:
            raise ProtocolError(f"hash KV payload of {len(data)} bytes is shorter than its "
                                "header")
        magic, version, key, start, count = _HEADER.unpack_from(data)
        if magic != MAGIC or version != _VERSION or start < 0 or count < 0:
            raise ProtocolError(f"bad hash KV header {(magic, version, start, count)}")
        if len(data) != _HEADER.size + count * (4 + STATE_BYTES):
            raise ProtocolError(f"hash KV payload has {len(data)} bytes, header says "
                                f"{count} tokens")
        values = struct.unpack_from(f"<{count}i{count}Q", data, _HEADER.size)
        seg = cls(key, start)
        seg.tokens, seg.states = list(values[:count]), list(values[count:])
        if count and min(seg.tokens) < 0:
            raise ProtocolError("hash KV payload holds a negative token id")
        return seg

    def _sums(self) -> list[int]:
        """The running sums of every state (filled in for appended segments)."""
        acc, states = self._acc, self.states
        a = acc[-1] if acc else 0
        for s in states[len(acc):]:
            a = (a + s) & _M
            acc.append(a)
        return acc


class HashDecoder:
    """The hash engine behind TinyDecoder's interface (see the module docstring)."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.key = mix((cfg.seed * _GOLDEN + 1) & _M)  # s_{-1}: names the chain
        self._pos_key = mix(self.key ^ _GOLDEN)

    def new_cache(self, capacity: int = 0) -> HashCache:
        """An empty cache (``capacity`` is TinyDecoder's; lists grow as needed)."""
        return HashCache(self.key)

    def _run(self, cache: HashCache, token_ids: Sequence[int],
             every: bool = False) -> HashLogits | list[HashLogits]:
        """Append token_ids to cache (computing their states); return the next token's
        HashLogits or, with ``every``, the list after each new token."""
        ids = [int(t) for t in token_ids]
        T, L, V = len(ids), cache.length, self.cfg.vocab_size
        if cache.start != 0:
            raise ValueError("the model runs on caches that start at position 0")
        if cache.key != self.key:
            raise ValueError("the cache belongs to another seed's chain")
        if T == 0 or L + T > self.cfg.max_context:
            raise ValueError(f"need 1..{self.cfg.max_context - L} new tokens, got {T}")
        if min(ids) < 0 or max(ids) >= V:
            raise ValueError(f"token ids must be in 0..{V - 1}")
        acc, states = cache._sums(), cache.states
        s = states[-1] if L else self.key
        a = acc[-1] if L else 0
        pk, out = self._pos_key, []
        for i, t in enumerate(ids, L):
            z = pk ^ (i << 32 | t)  # mix(key ^ (i, t)), inlined: the per-token cost
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
            z = s ^ z ^ (z >> 31)
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
            s = z ^ (z >> 31)
            a = (a + s) & _M
            states.append(s)
            acc.append(a)
            if every:
                out.append(HashLogits(mix(s ^ (a * _OUT_MUL & _M)) % V))
        cache.tokens.extend(ids)
        return out if every else HashLogits(mix(s ^ (a * _OUT_MUL & _M)) % V)

    def prefill(self, tokens: Sequence[int],
                cache: HashCache | None = None) -> tuple[HashLogits, HashCache]:
        """States of the tokens not yet in ``cache`` (a cached prefix); the next token.

        If the cache already holds every token, the last one is recomputed.
        Example: ``logits, cache = model.prefill(prompt, prefix_cache)``.
        """
        cache, new = split_prefill(tokens, cache, self.new_cache)
        return self._run(cache, new), cache

    def decode_step(self, cache: HashCache, token: int) -> HashLogits:
        """Feed one token, return the next: ``tok = argmax(model.decode_step(cache, tok))``."""
        return self._run(cache, [token])

    def extend(self, cache: HashCache, token_ids: Sequence[int]) -> HashLogits:
        """Compute the states of several token ids (MD's handoff); return the next token.

        Example: ``next_tok = argmax(model.extend(md_cache, relay_tokens))``.
        """
        return self._run(cache, token_ids)

    def score(self, tokens: Sequence[int]) -> list[HashLogits]:
        """The next token after every position, no cache kept: ``out`` is the greedy
        continuation of ``prompt`` iff ``[l.token for l in model.score(prompt + out)
        [len(prompt) - 1 : -1]] == out``."""
        return self._run(self.new_cache(), tokens, every=True)

    def greedy_generate(self, prompt: Sequence[int], n: int, use_cache: bool = True) -> list[int]:
        """The single-process reference: n greedy tokens after prompt (``use_cache=False``
        recomputes the whole sequence for every token). Example: ``greedy_generate([1], 8)``."""
        out: list[int] = []
        if use_cache and n > 0:
            logits, cache = self.prefill(prompt)
            while True:
                out.append(logits.token)
                if len(out) == n:
                    return out
                logits = self.decode_step(cache, out[-1])
        while len(out) < n:
            logits, _ = self.prefill(list(prompt) + out)
            out.append(logits.token)
        return out
