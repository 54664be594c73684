"""Which compute engine a role runs, and the calls that do not care which.

Owns ``ModelConfig`` (the engine and the tiny model's shape and seed; torch-free,
so a role on the hash engine never imports torch) and the dispatch the roles,
verify and the benches use: ``build_model``, ``argmax``, ``kv_from_bytes``,
``pin_threads``. Engines (``ModelConfig.engine``, one of ``testbed.types.ENGINES``):

- ``torch`` (the default): ``model.TinyDecoder``, the tiny seeded transformer
  with a real KV cache (``model.KVCache``); costs milliseconds per token;
- ``hash``: ``hashmodel.HashDecoder``, a 64-bit hash chain over the prefix with
  one state per position as its "KV" (``hashmodel.HashCache``); costs
  microseconds per token, so the roles' real compute stays far below the
  modeled times on a small machine.

Both make the next token a deterministic function of the whole prefix and
its KV, so token-ID handoff, MD's extend recompute, prefix caching and the
post-run check against a monolithic ``greedy_generate`` work the same.

Example::

    cfg = ModelConfig(engine="hash")
    model = build_model(cfg)
    logits, cache = model.prefill([1, 2, 3])
    seg = kv_from_bytes(cache.to_bytes(), cfg.engine)   # what a KV_CHUNK carries
    tok = argmax(model.extend(seg, [argmax(logits)]))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from testbed.errors import ProtocolError
from testbed.pdd.compute import hashmodel
from testbed.pdd.compute.hashmodel import HashCache, HashDecoder, HashLogits
from testbed.types import ENGINES, PDD_DEFAULTS

if TYPE_CHECKING:
    from testbed.pdd.compute.model import KVCache, TinyDecoder

DTYPES = ("float32", "float64")  # the torch engine's
TORCH_MAGIC = b"KVC\x00"  # model.KVCache's wire magic (model.py imports torch)
_MAGICS = {TORCH_MAGIC: "torch", hashmodel.MAGIC: "hash"}

Model = Union["TinyDecoder", HashDecoder]
Cache = Union["KVCache", HashCache]


@dataclass(frozen=True)
class ModelConfig:
    """Engine, shape and seed of the tiny model; same config -> same tokens everywhere."""

    vocab_size: int = field(default=512, metadata={"help": "token ids are 0..vocab_size-1"})
    n_layer: int = field(default=4, metadata={"help": "transformer blocks"})
    n_head: int = field(default=4, metadata={"help": "attention heads per block"})
    d_model: int = field(default=256, metadata={"help": "residual width; divisible by n_head"})
    max_context: int = field(default=4096, metadata={"help": "longest sequence (learned pos.)"})
    seed: int = field(default=0, metadata={"help": "weight seed (hash: the chain's seed)"})
    dtype: str = field(default="float64", metadata={"help": "float64 (exact handoff) or float32"})
    prefill_chunk: int = field(default=128, metadata={
        "help": "prefill runs in chunks of this many tokens (skips half the causal attention)"})
    engine: str = field(default=PDD_DEFAULTS.engine, metadata={
        "help": "torch (the tiny transformer) | hash (model-free hash chain, microseconds per "
                "token; n_layer, n_head, d_model, dtype and prefill_chunk unused)",
        "choices": ENGINES})

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {' | '.join(ENGINES)}, "
                             f"got {self.engine!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} not divisible by n_head {self.n_head}")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")

    @property
    def head_size(self) -> int:
        return self.d_model // self.n_head

    @property
    def torch_dtype(self):
        """The torch dtype of ``dtype`` (imports torch)."""
        import torch

        return {"float32": torch.float32, "float64": torch.float64}[self.dtype]

    @property
    def kv_wire_bytes_per_token(self) -> int:
        """Real KV bytes one token takes in a KV_CHUNK: its id plus K and V of every
        layer (torch) or its state (hash)."""
        if self.engine == "hash":
            return 4 + hashmodel.STATE_BYTES
        return 4 + 2 * self.n_layer * self.d_model * (4 if self.dtype == "float32" else 8)


def build_model(cfg: ModelConfig | None = None) -> Model:
    """The seeded model of ``cfg.engine``, e.g. ``build_model(ModelConfig(engine="hash"))``."""
    cfg = cfg or ModelConfig()
    if cfg.engine == "hash":
        return HashDecoder(cfg)
    from testbed.pdd.compute.model import TinyDecoder

    return TinyDecoder(cfg)


def argmax(logits) -> int:
    """The greedy next token of either engine's logits (torch: ``model.argmax``, ties to
    the lowest id; hash: its token). Example: ``argmax(model.decode_step(cache, tok))``."""
    if isinstance(logits, HashLogits):
        return logits.token
    from testbed.pdd.compute.model import argmax as torch_argmax

    return torch_argmax(logits)


def kv_from_bytes(data: bytes | bytearray | memoryview, engine: str) -> Cache:
    """The KV segment of ``engine`` in ``data`` (``cache.to_bytes``); ProtocolError if it
    is malformed or another engine's. Example: ``kv_from_bytes(chunk.data, "hash")``."""
    other = _MAGICS.get(bytes(data[:4]))
    if other is not None and other != engine:
        raise ProtocolError(f"KV payload of the {other} engine, this role runs the "
                            f"{engine} engine")
    if engine == "hash":
        return HashCache.from_bytes(data)
    from testbed.pdd.compute.model import KVCache

    return KVCache.from_bytes(data)


def pin_threads(cfg: ModelConfig, n: int = 1) -> None:
    """Pin torch's intra-op threads if ``cfg`` runs torch (once per role process); the
    hash engine imports no torch. Example: ``pin_threads(cfg.model, 1)``."""
    if cfg.engine == "torch":
        from testbed.pdd.compute.model import set_threads

        set_threads(n)
