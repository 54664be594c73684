"""What a workload is once built: requests, their measured hit rates, summary statistics.

Owns WorkloadRequest, LengthStats, BinShare, WorkloadStats, Workload and
``summarize``. A Workload is immutable: generators build the request tuple,
then ``summarize`` replays the prompts through the unbounded 16-token block
cache (cachesim) to measure what the prefill role's cache would see; the
designed hit rates stored on requests are never used for the statistics.

Example::

    stats, measured = summarize(requests, pdd_bins())
    stats.hit_rate_token_weighted        # e.g. 0.91
    stats.hit_histogram[-1]              # BinShare(lo_pct=99, hi_pct=100, share=0.27)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from testbed.workload.cachesim import BLOCK_TOKENS, measure_hit_tokens
from testbed.workload.hitrate import HitBin, histogram
from testbed.workload.spec import WorkloadSpec


@dataclass(frozen=True)
class WorkloadRequest:
    id: int  # 0.. in arrival order
    arrival_s: float  # from the workload start
    prompt: tuple[int, ...] = field(repr=False)  # token IDs in 0..VOCAB_SIZE-1
    output_len: int  # tokens to generate (>= 1)
    session: int  # conversation id; turns of one session share prefixes
    designed_hit_rate: float  # fraction of the prompt meant to repeat an earlier prompt's prefix
    anomalous: bool = False  # long input, < 500 output tokens (PDD's filtered traffic)
    warmup: bool = False  # sent before the measured requests; not measured

    @property
    def input_len(self) -> int:
        return len(self.prompt)


@dataclass(frozen=True)
class LengthStats:
    mean: float
    p50: float
    p90: float
    p99: float
    max: int

    @classmethod
    def of(cls, values: Sequence[int]) -> "LengthStats":
        if not len(values):
            return cls(0.0, 0.0, 0.0, 0.0, 0)
        a = np.asarray(values, dtype=np.float64)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return cls(float(a.mean()), float(p50), float(p90), float(p99), int(a.max()))


@dataclass(frozen=True)
class BinShare:
    lo_pct: float
    hi_pct: float
    share: float  # fraction of requests whose measured hit rate is in the bin


@dataclass(frozen=True)
class WorkloadStats:
    """Summary of a workload as an unbounded 16-token block prefix cache sees it."""

    count: int
    span_s: float  # last arrival time
    input_len: LengthStats  # prompt tokens
    output_len: LengthStats
    prompt_tokens: int
    hit_tokens: int
    hit_rate_token_weighted: float  # hit_tokens / prompt_tokens
    hit_rate_mean: float  # mean over requests of each request's hit fraction
    hit_histogram: tuple[BinShare, ...]  # per-request measured hit rates, binned
    cache_block_tokens: int = BLOCK_TOKENS

    @property
    def mean_rate_rps(self) -> float:
        return (self.count - 1) / self.span_s if self.count > 1 and self.span_s > 0 else 0.0


@dataclass(frozen=True)
class Workload:
    requests: tuple[WorkloadRequest, ...] = field(repr=False)
    spec: WorkloadSpec
    stats: WorkloadStats
    # measured hit fraction of each request (same order as requests)
    measured_hit_rates: tuple[float, ...] = field(repr=False)
    # sent (and completed) before the measured requests, which see their prompts cached
    warmup: tuple[WorkloadRequest, ...] = field(default=(), repr=False)


def summarize(requests: Sequence[WorkloadRequest], bins: tuple[HitBin, ...],
              block_tokens: int = BLOCK_TOKENS, preload: Sequence[WorkloadRequest] = ()
              ) -> tuple[WorkloadStats, tuple[float, ...]]:
    """Statistics and per-request measured hit fractions, replaying prompts in order
    after the ``preload`` prompts (warm-up requests, themselves not counted)."""
    prompts = [r.prompt for r in preload] + [r.prompt for r in requests]
    hits = measure_hit_tokens(prompts, block_tokens)[len(preload):]
    lens = [r.input_len for r in requests]
    rates = tuple(h / n for h, n in zip(hits, lens))
    shares = histogram((100.0 * x for x in rates), bins)
    total, hit_total = sum(lens), sum(hits)
    stats = WorkloadStats(
        count=len(requests),
        span_s=requests[-1].arrival_s if requests else 0.0,
        input_len=LengthStats.of(lens),
        output_len=LengthStats.of([r.output_len for r in requests]),
        prompt_tokens=total,
        hit_tokens=hit_total,
        hit_rate_token_weighted=hit_total / total if total else 0.0,
        hit_rate_mean=float(np.mean(rates)) if rates else 0.0,
        hit_histogram=tuple(BinShare(b.lo_pct, b.hi_pct, s) for b, s in zip(bins, shares)),
        cache_block_tokens=block_tokens,
    )
    return stats, rates
