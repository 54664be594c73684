"""The tiny seeded torch decoder that produces the PDD roles' real tokens (engine "torch").

This module owns the model weights, the explicit per-request KV cache and the
forward operations the roles use; ``ModelConfig`` and the dispatch between
this engine and the hash engine live in ``engine.py`` (ModelConfig is
re-exported here). Lifecycle of one request's KV:

    P:   logits, cache = model.prefill(prompt)         # or extend a prefix cache
         wire = cache.to_bytes(start, end)              # ship the suffix MD lacks
    RLD: cache = KVCache.from_bytes(wire); decode_step() ... streams tokens
    MD:  cache.append(KVCache.from_bytes(wire))         # onto its radix prefix
         logits = model.extend(cache, relay_token_ids)  # recompute handed-over KV
         decode_step() ... until the request ends

Every process builds the same weights from ``ModelConfig.seed`` (a private
torch.Generator, parameters filled in a fixed order), and tokens are greedy
argmax, so any process can check that PDD's output equals
``greedy_generate``, the plain single-process reference.

Numerics: the default dtype is float64. A batched ``extend`` of n tokens and n
single ``decode_step`` calls run different matmul kernels and reduction
orders, so their logits differ in the last bits. Measured on the default
config (160 extends of 1..63 tokens after prompts of 1..300 tokens): the
largest logit difference is 2.5e-6 in float32 and 4e-15 in float64, while
the smallest top-2 logit gap seen in 2,560 greedy steps was 2.4e-5. So
float32 would flip an argmax roughly once per ~1e4-1e5 tokens, i.e. a few
times in a run; float64 makes it practically impossible. Exact token equality
is a hard requirement, so float64 is the default (about 2x slower than
float32, which stays available for speed experiments).

Speed (default config, float64, one thread, 2-core dev VM): prefill of 2K
tokens ~1.6 s (chunked; 4.3 s in one pass), a decode step ~5 ms at 100
tokens of context and ~11 ms at 2K, extend of 100 tokens at 2K ~110 ms.
float32 is roughly 2x faster.

One request per forward pass (no batch dimension): continuous batching is
modeled by ``costmodel``, not computed. Shapes below: T new tokens, L tokens
already cached, C = d_model, nh heads of size hs.
"""

from __future__ import annotations

import math
import struct
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from testbed.errors import ProtocolError
from testbed.pdd.compute.engine import TORCH_MAGIC, ModelConfig  # noqa: F401 (re-exported)
from testbed.pdd.compute.cachebase import TokenSpan, split_prefill

_DTYPE_CODES = {torch.float32: 1, torch.float64: 2}
_NP_DTYPES = {torch.float32: np.dtype("<f4"), torch.float64: np.dtype("<f8")}  # wire: little-endian
_HEADER = struct.Struct("<4sBHHHBqq")  # magic, version, n_layer, nh, hs, dtype, start, count
_MAGIC, _VERSION = TORCH_MAGIC, 1


def set_threads(n: int = 1) -> None:
    """Pin torch's intra-op threads (call once per role process), e.g. ``set_threads(1)``."""
    torch.set_num_threads(n)


class KVCache(TokenSpan):
    """Keys and values of a contiguous token range [start, end) for every layer.

    Per layer, ``k[i]`` and ``v[i]`` are buffers of shape (nh, capacity, hs)
    of which the first ``length`` positions are valid; ``tokens`` holds the
    token ids they belong to. A cache the model runs on starts at position 0;
    a cache with ``start > 0`` is a segment cut out by ``slice`` or received
    from the wire, to be ``append``-ed onto a cache ending where it starts.
    """

    def __init__(self, n_layer: int, n_head: int, head_size: int,
                 dtype: torch.dtype = torch.float64, start: int = 0):
        self.n_layer, self.n_head, self.head_size = n_layer, n_head, head_size
        self.dtype, self.start = dtype, start
        self.tokens: list[int] = []
        self.k = [torch.empty(n_head, 0, head_size, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.empty(n_head, 0, head_size, dtype=dtype) for _ in range(n_layer)]

    @property
    def nbytes_per_token(self) -> int:
        """K and V bytes of one token over all layers (the tiny model's, not the modeled one's)."""
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * self.n_layer * self.n_head * self.head_size * itemsize

    def keys(self, layer: int) -> torch.Tensor:
        return self.k[layer][:, : self.length]  # (nh, length, hs)

    def values(self, layer: int) -> torch.Tensor:
        return self.v[layer][:, : self.length]  # (nh, length, hs)

    def _like(self, start: int) -> KVCache:
        return KVCache(self.n_layer, self.n_head, self.head_size, self.dtype, start)

    def _reserve(self, n_more: int) -> None:
        need = self.length + n_more
        cap = self.k[0].shape[1]
        if need <= cap:
            return
        new_cap = max(need, 2 * cap, 16)
        for store in (self.k, self.v):
            for i, old in enumerate(store):
                buf = torch.empty(self.n_head, new_cap, self.head_size, dtype=self.dtype)
                buf[:, : self.length] = old[:, : self.length]
                store[i] = buf

    def _put(self, layer: int, k: torch.Tensor,
             v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new (nh, T, hs) K/V after the valid range; return (nh, length+T, hs) views."""
        end = self.length + k.shape[1]
        self.k[layer][:, self.length : end] = k
        self.v[layer][:, self.length : end] = v
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def append(self, other: KVCache) -> None:
        """Append a segment starting where this cache ends.

        Example: ``cache.append(KVCache.from_bytes(wire))``.
        """
        if other.start != self.end:
            raise ValueError(f"segment starts at {other.start}, cache ends at {self.end}")
        if (other.n_layer, other.n_head, other.head_size, other.dtype) != (
                self.n_layer, self.n_head, self.head_size, self.dtype):
            raise ValueError("segment shape or dtype does not match this cache")
        self._reserve(other.length)
        for i in range(self.n_layer):
            self._put(i, other.keys(i), other.values(i))
        self.tokens.extend(other.tokens)

    def truncate(self, n: int) -> None:
        """Keep only the first n tokens, e.g. ``c.truncate(len(prompt))``."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate {self.length} tokens to {n}")
        del self.tokens[n:]

    def slice(self, start: int, end: int) -> KVCache:
        """Copy of absolute positions [start, end), e.g. ``c.slice(hit, c.end)``."""
        if not self.start <= start <= end <= self.end:
            raise ValueError(f"range [{start}, {end}) outside [{self.start}, {self.end})")
        lo, hi = start - self.start, end - self.start
        seg = self._like(start)
        seg._reserve(hi - lo)
        for i in range(self.n_layer):
            seg._put(i, self.k[i][:, lo:hi], self.v[i][:, lo:hi])
        seg.tokens = self.tokens[lo:hi]
        return seg

    def to_bytes(self, start: int | None = None, end: int | None = None) -> bytearray:
        """Serialize positions [start, end) (default: all), e.g. ``c.to_bytes(512, c.end)``.

        Each K/V value is copied once, straight into the returned buffer.
        """
        start = self.start if start is None else start
        end = self.end if end is None else end
        if not self.start <= start <= end <= self.end:
            raise ValueError(f"range [{start}, {end}) outside [{self.start}, {self.end})")
        lo, hi = start - self.start, end - self.start
        count, nh, hs = hi - lo, self.n_head, self.head_size
        np_dtype = _NP_DTYPES[self.dtype]
        n_vals = self.n_layer * 2 * nh * count * hs
        out = bytearray(_HEADER.size + 4 * count + n_vals * np_dtype.itemsize)
        _HEADER.pack_into(out, 0, _MAGIC, _VERSION, self.n_layer, nh, hs,
                          _DTYPE_CODES[self.dtype], start, count)
        np.frombuffer(out, "<i4", count, _HEADER.size)[:] = self.tokens[lo:hi]
        kv = np.frombuffer(out, np_dtype, n_vals, _HEADER.size + 4 * count)
        kv = kv.reshape(self.n_layer, 2, nh, count, hs)  # layer-major: K then V, (nh, count, hs)
        for i in range(self.n_layer):
            kv[i, 0] = self.k[i][:, lo:hi].numpy()
            kv[i, 1] = self.v[i][:, lo:hi].numpy()
        return out

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> KVCache:
        """Rebuild a segment from ``to_bytes`` output; raises ProtocolError if malformed."""
        if len(data) < _HEADER.size:
            raise ProtocolError(f"KV payload of {len(data)} bytes is shorter than its header")
        magic, version, n_layer, nh, hs, code, start, count = _HEADER.unpack_from(data)
        dtype = {c: d for d, c in _DTYPE_CODES.items()}.get(code)
        if (magic != _MAGIC or version != _VERSION or dtype is None or start < 0 or count < 0
                or min(n_layer, nh, hs) < 1):
            raise ProtocolError(f"bad KV header {(magic, version, code, start, count)}")
        seg = cls(n_layer, nh, hs, dtype, start)
        np_dtype = _NP_DTYPES[dtype]
        n_vals = n_layer * 2 * nh * count * hs
        if len(data) != _HEADER.size + 4 * count + n_vals * np_dtype.itemsize:
            raise ProtocolError(f"KV payload has {len(data)} bytes, header says otherwise")
        tokens = np.frombuffer(data, dtype="<i4", count=count, offset=_HEADER.size)
        kv = np.frombuffer(data, dtype=np_dtype, count=n_vals, offset=_HEADER.size + 4 * count)
        kv = kv.reshape(n_layer, 2, nh, count, hs)
        kv = torch.from_numpy(kv.astype(np_dtype.newbyteorder("=")))  # native, aligned copy
        # the segment's buffers are views of that copy (capacity = count): no second copy
        seg.k = [kv[i, 0] for i in range(n_layer)]
        seg.v = [kv[i, 1] for i in range(n_layer)]
        seg.tokens = tokens.tolist()
        return seg


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention over the KV cache, then a GELU MLP."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        C = cfg.d_model
        self.nh, self.hs = cfg.n_head, cfg.head_size
        self.ln_1 = nn.LayerNorm(C, bias=False)
        self.c_attn = nn.Linear(C, 3 * C, bias=False)
        self.c_proj = nn.Linear(C, C, bias=False)
        self.ln_2 = nn.LayerNorm(C, bias=False)
        self.c_fc = nn.Linear(C, 4 * C, bias=False)
        self.mlp_proj = nn.Linear(4 * C, C, bias=False)

    def attend(self, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        T, C = x.shape  # (T, C)
        L = cache.length
        q, k, v = self.c_attn(x).split(C, dim=1)  # each (T, C)
        q, k, v = (t.view(T, self.nh, self.hs).transpose(0, 1) for t in (q, k, v))  # (nh, T, hs)
        k_all, v_all = cache._put(layer, k, v)  # (nh, L+T, hs)
        att = (q @ k_all.transpose(1, 2)) * (1.0 / math.sqrt(self.hs))  # (nh, T, L+T)
        if T > 1:  # query i (position L+i) may see keys 0..L+i
            mask = torch.ones(T, L + T, dtype=torch.bool).tril(diagonal=L)
            att = att.masked_fill(~mask, float("-inf"))
        y = att.softmax(dim=-1) @ v_all  # (nh, T, hs)
        return self.c_proj(y.transpose(0, 1).reshape(T, C))  # (T, C)

    def forward(self, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        x = x + self.attend(self.ln_1(x), cache, layer)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))  # (T, C)


class TinyDecoder(nn.Module):
    """nanoGPT-sized decoder with learned positions and an explicit KV cache."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_context, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        self.to(cfg.torch_dtype).eval().requires_grad_(False)

    def _init_weights(self) -> None:
        # Fixed order, private generator: identical weights in every process.
        # Embeddings ~N(0, 1) and linears ~N(0, 1/fan_in) keep every block's
        # contribution O(1), so tokens depend on the whole context (a KV bug
        # changes the output instead of hiding under a dominant embedding).
        gen = torch.Generator().manual_seed(self.cfg.seed)
        for name, p in self.named_parameters():
            if "ln" in name:
                p.data.fill_(1.0)
            elif name.startswith(("wte", "wpe")):
                p.data.normal_(0.0, 1.0, generator=gen)
            else:
                p.data.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=gen)

    def new_cache(self, capacity: int = 0) -> KVCache:
        """An empty cache with room for ``capacity`` tokens (it grows past that by doubling,
        copying what it holds: give the final length when it is known)."""
        c = self.cfg
        cache = KVCache(c.n_layer, c.n_head, c.head_size, c.torch_dtype)
        if capacity > 0:
            cache._reserve(min(capacity, c.max_context))
        return cache

    @torch.no_grad()
    def _run(self, cache: KVCache, token_ids: Sequence[int], every: bool = False) -> torch.Tensor:
        """Append token_ids to cache (computing their KV); return the last logits (V,)
        or, with ``every``, the logits after each new token (T, V)."""
        T, L = len(token_ids), cache.length
        if cache.start != 0:
            raise ValueError("the model runs on caches that start at position 0")
        if T == 0 or L + T > self.cfg.max_context:
            raise ValueError(f"need 1..{self.cfg.max_context - L} new tokens, got {T}")
        idx = torch.tensor(token_ids, dtype=torch.long)  # (T,)
        if idx.min() < 0 or idx.max() >= self.cfg.vocab_size:
            raise ValueError(f"token ids must be in 0..{self.cfg.vocab_size - 1}")
        x = self.wte(idx) + self.wpe(torch.arange(L, L + T))  # (T, C)
        cache._reserve(T)
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i)  # (T, C)
        cache.tokens.extend(int(t) for t in token_ids)
        return self.lm_head(self.ln_f(x if every else x[-1]))  # (T, V) or (V,)

    def prefill(self, tokens: Sequence[int],
                cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """Compute the KV of the tokens not yet in ``cache`` (a cached prefix); return last logits.

        Runs in chunks of ``cfg.prefill_chunk`` tokens. If the cache already
        holds every token, the last one is recomputed to get its logits.
        Example: ``logits, cache = model.prefill(prompt, prefix_cache)``.
        """
        cache, new = split_prefill(tokens, cache, self.new_cache)
        chunk = self.cfg.prefill_chunk
        for i in range(0, len(new), chunk):
            logits = self._run(cache, new[i : i + chunk])
        return logits, cache

    def decode_step(self, cache: KVCache, token: int) -> torch.Tensor:
        """Feed one token, return next-token logits.

        Example: ``tok = argmax(model.decode_step(cache, tok))``.
        """
        return self._run(cache, [token])

    def extend(self, cache: KVCache, token_ids: Sequence[int]) -> torch.Tensor:
        """Recompute the KV of several token ids in one pass (MD's handoff); return last logits.

        Example: ``next_tok = argmax(model.extend(md_cache, relay_tokens))``.
        """
        return self._run(cache, token_ids)

    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """Logits after every position in one pass, (T, V), with no cache kept.

        Checks a greedy output cheaply: ``out`` is the greedy continuation of
        ``prompt`` iff ``model.score(prompt + out)[len(prompt) - 1 : -1].argmax(-1)``
        equals ``out``.
        """
        return self._run(self.new_cache(), tokens, every=True)

    def greedy_generate(self, prompt: Sequence[int], n: int, use_cache: bool = True) -> list[int]:
        """The single-process reference: n greedy tokens after prompt.

        ``use_cache=False`` recomputes the whole sequence for every token
        (nanoGPT's generate; slow, independent of the KV cache code).
        Example: ``model.greedy_generate([1, 2, 3], 16)``.
        """
        out: list[int] = []
        if use_cache and n > 0:
            logits, cache = self.prefill(prompt)
            while True:
                out.append(argmax(logits))
                if len(out) == n:
                    return out
                logits = self.decode_step(cache, out[-1])
        while len(out) < n:
            logits, _ = self.prefill(list(prompt) + out)
            out.append(argmax(logits))
        return out


def argmax(logits: torch.Tensor) -> int:
    """Greedy choice; ties go to the lowest token id. Example: ``argmax(logits)``."""
    return int(torch.argmax(logits).item())


def build_model(cfg: ModelConfig | None = None) -> TinyDecoder:
    """The seeded model in eval mode, e.g. ``build_model(ModelConfig(seed=7))``; another
    ``cfg.engine`` builds that engine's (``engine.build_model``)."""
    cfg = cfg or ModelConfig()
    if cfg.engine != "torch":
        from testbed.pdd.compute.engine import build_model as build

        return build(cfg)
    return TinyDecoder(cfg)
