"""Modeled time of the big model's forward passes, and pacing roles to it.

This module owns the testbed's notion of compute time. The tiny torch model
makes the tokens; the times come from here:

- ``ChipProfile``: one accelerator kind. ``GPU_A`` (strong compute) runs P
  and RLD in DC A; ``GPU_B`` (strong memory bandwidth) runs MD in DC B.
- ``ModelProfile``: the modeled big model (``BIG_MODEL``), incl. its KV
  bytes per token (50 KB, as the paper takes it: docs/paper.md).
- ``CostModel``: a roofline for one forward pass on an instance of
  ``n_chips`` chips: ``overhead + max(FLOPs / compute, bytes / bandwidth)``.
  Prefill, a continuous-batching decode step and MD's extend-decode are all
  such passes, differing in how many tokens go in and how much KV is read.
  The decode loop (``testbed.pdd.compute.decoder``) asks it for each step's time.

Pure arithmetic. Pacing a role to these times is ``testbed.pdd.compute.pacing``.

Order-of-magnitude checks (tested in tests/unit/test_costmodel.py) against
the paper (docs/paper.md) with the defaults (4-chip instances, 70B-class model):
full 64K prefill on GPU_A ~8 s and a 10%-miss suffix ~1 s ("seconds"); a
decode step at batch 16 x 64K on GPU_B ~16 ms ("tens of ms"); extend of 100
handed-over tokens on 64K context on GPU_B ~46 ms, which with a WAN of tens
of ms each way and a scheduling wait is consistent with the paper's 305 ms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable


@dataclass(frozen=True)
class ChipProfile:
    """One accelerator kind. Illustrative figures of the right order, not a datasheet."""

    name: str
    peak_tflops: float = field(metadata={"help": "dense bf16 TFLOP/s per chip"})
    mem_bw_tbs: float = field(metadata={"help": "HBM bandwidth per chip, TB/s"})
    compute_eff: float = field(default=0.45, metadata={"help": "achieved fraction of peak FLOPs"})
    mem_eff: float = field(default=0.75, metadata={"help": "achieved fraction of HBM bandwidth"})
    hbm_gb: float = field(default=80.0, metadata={"help": "device memory per chip, GB"})
    pass_overhead_ms: float = field(default=3.0, metadata={
        "help": "fixed cost per forward pass: launches, TP all-reduce latency, scheduler"})


# H100-class compute with lower bandwidth: good at prefill.
GPU_A = ChipProfile("GPU-A", peak_tflops=990.0, mem_bw_tbs=3.35, compute_eff=0.45, mem_eff=0.70,
                    hbm_gb=80.0)
# H20/H200-class: modest compute, high bandwidth: good at decode.
GPU_B = ChipProfile("GPU-B", peak_tflops=400.0, mem_bw_tbs=4.8, compute_eff=0.45, mem_eff=0.75,
                    hbm_gb=141.0)


@dataclass(frozen=True)
class ModelProfile:
    """The modeled big model whose timing and KV size the testbed emulates."""

    name: str = "big-70b"
    n_params: float = field(default=70e9, metadata={"help": "parameters used per token"})
    bytes_per_param: float = field(default=2.0, metadata={"help": "2 for bf16, 1 for fp8"})
    n_layers: int = field(default=80, metadata={"help": "transformer layers"})
    d_attn: int = field(default=8192, metadata={"help": "query heads x head dim (attention FLOPs)"})
    kv_bytes_per_token: int = field(default=50_000, metadata={"help": "KV cache bytes per token"})

    @property
    def weight_bytes(self) -> float:
        return self.n_params * self.bytes_per_param


BIG_MODEL = ModelProfile()


@dataclass(frozen=True)
class CostModel:
    """Forward-pass times on one instance of ``n_chips`` chips of one kind.

    Example: ``CostModel(GPU_B).decode_step_s(batch=16, total_context=16 * 65536)``.
    """

    chip: ChipProfile
    model: ModelProfile = BIG_MODEL
    n_chips: int = 4
    token_scale: int = 1  # modeled prompt/context tokens per real (tiny-model) token

    def __post_init__(self) -> None:
        if self.n_chips < 1:
            raise ValueError(f"n_chips must be >= 1, got {self.n_chips}")
        if self.token_scale < 1:
            raise ValueError(f"token_scale must be >= 1, got {self.token_scale}")

    def _roofline_s(self, n_tokens: int, attn_pairs: float, kv_read_tokens: float) -> float:
        """One pass computing n_tokens, with attn_pairs (query, key) pairs, reading that much KV."""
        m, c = self.model, self.chip
        flops = 2.0 * m.n_params * n_tokens + 4.0 * m.n_layers * m.d_attn * attn_pairs
        nbytes = m.weight_bytes + m.kv_bytes_per_token * (kv_read_tokens + n_tokens)
        compute_s = flops / (self.n_chips * c.peak_tflops * 1e12 * c.compute_eff)
        memory_s = nbytes / (self.n_chips * c.mem_bw_tbs * 1e12 * c.mem_eff)
        return c.pass_overhead_ms / 1e3 + max(compute_s, memory_s)

    def pass_s(self, segments: Iterable[tuple[int, int]]) -> float:
        """One pass over several requests, each ``(n_new_tokens, n_context_tokens)``.

        A decode request is ``(1, context)``, an extend ``(n, context)``; a mixed
        continuous batch is their list. Example: ``cm.pass_s([(1, 4096), (100, 65536)])``.
        """
        n_tokens = pairs = kv_read = 0
        for n_new, n_ctx in segments:
            if n_new < 0 or n_ctx < 0:
                raise ValueError(f"negative segment ({n_new}, {n_ctx})")
            n_ctx *= self.token_scale  # contexts are modeled; new decode/extend tokens are 1:1
            n_tokens += n_new
            pairs += n_new * n_ctx + n_new * (n_new + 1) // 2  # causal over the new tokens
            kv_read += n_ctx if n_new else 0
        if n_tokens == 0:
            return 0.0
        return self._roofline_s(n_tokens, pairs, kv_read)

    def prefill_s(self, n_new: int, n_cached: int = 0) -> float:
        """Prefill n_new tokens after n_cached prefix-cached ones: ``prefill_s(6554, 58982)``.

        Both counts are prompt tokens, so both are scaled by ``token_scale``.
        """
        return self.pass_s([(n_new * self.token_scale, n_cached)])

    def decode_step_s(self, batch: int, total_context: int) -> float:
        """One decode step of ``batch`` requests whose cached contexts sum to ``total_context``.

        Memory-bound at realistic sizes: weights once plus every request's KV.
        Example: ``decode_step_s(16, 16 * 65536)``.
        """
        if batch < 0 or total_context < 0:
            raise ValueError(f"negative batch {batch} or context {total_context}")
        if batch == 0:
            return 0.0
        total_context *= self.token_scale
        return self._roofline_s(batch, total_context + batch, total_context)

    def kv_capacity_tokens(self, usable_frac: float = 0.9) -> int:
        """Modeled tokens of KV the instance holds: usable device memory minus the weights.

        Example: ``CostModel(GPU_A).kv_capacity_tokens()`` (4 x 80 GB: ~2.9M tokens).
        """
        free = self.n_chips * self.chip.hbm_gb * 1e9 * usable_frac - self.model.weight_bytes
        return max(0, int(free / self.model.kv_bytes_per_token))

    def max_batch(self, context_tokens: int, step_budget_s: float, limit: int = 4096) -> int:
        """The largest decode batch of requests of ``context_tokens`` (real, scaled by
        token_scale) whose step stays within ``step_budget_s``; 0 if even one does not."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.decode_step_s(mid, mid * context_tokens) <= step_budget_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def extend_s(self, n_tokens: int, n_context: int) -> float:
        """Extend-decode of n_tokens handed-over token ids on n_context cached tokens, one pass.

        Example: ``CostModel(GPU_B).extend_s(100, 65536)`` (MD's handoff recompute).
        """
        return self.pass_s([(n_tokens, n_context)])
