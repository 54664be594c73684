"""The router's per-request pipeline decision, as pure functions (no I/O).

Owns ``choose_pipeline`` (the rule of docs/pdd-roles.md), ``WanEstimate``
(EWMA of MD-reported WAN transfer rates, a configured prior until the first
report) and ``PrefixMirror`` (the router's radix mirror of P's prefix cache:
same block size and capacity, fed with every routed prompt in routing order,
which is P's FIFO order, so its LRU evicts what P's evicts). The router
keeps one more mirror per MD, of its DRC, fed with the prompts of the
requests routed through that MD: MD fetches over the WAN only what its DRC
lacks, and the DRC falls behind P's cache whenever a request never reaches
MD (anomalous, rld-only), so P's hit alone underestimates the transfer.

Rule, per mode:

- ``cross-dc-pd``: always ``p-md``; ``same-dc-pd``: always ``rld-only``.
- ``pdd`` and ``p-rld``: the anomalous filter first (when on): prompt >=
  ``anomalous_min_input_tokens`` (modeled: prompt x token_scale) and max output <
  ``anomalous_max_output_tokens``
  -> ``rld-only``. Then expected WAN time = missing KV bytes (nominal,
  ``(prompt - MD hit) * kv_bytes_per_token``) / WAN estimate + ``wan_rtt_s``;
  below ``relay_threshold_s`` -> ``p-md``. Otherwise ``pdd`` picks
  ``p-rld-md`` unless RLD already holds ``rld_max_active`` requests (then
  ``p-md``); ``p-rld`` picks ``rld-only`` (no load guard: that is the
  design the paper excludes because it overloads RLD).

Example::

    d = choose_pipeline(Mode.PDD, RouterConfig(), TimingConfig(),
                        RouteInputs(prompt_len=4096, max_out=512, hit_tokens=0, rld_active=3),
                        wan_gbit=10.0)
    d.pipeline, d.reason, d.expected_wan_s
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from testbed.pdd.config import Mode, Pipeline, RouterConfig, TimingConfig
from testbed.pdd.radix import RadixCache


@dataclass(frozen=True)
class RouteInputs:
    """What the router knows about a request when routing it."""

    prompt_len: int
    max_out: int
    hit_tokens: int  # P's expected prefix-cache hit (from the mirror)
    rld_active: int  # requests RLD currently holds
    # MD's expected DRC hit (from the router's mirror of it): what MD lacks is
    # what crosses the WAN. None: assume MD holds what P holds (DRC aligned).
    md_hit_tokens: int | None = None


@dataclass(frozen=True)
class RouteDecision:
    pipeline: Pipeline
    reason: str
    expected_wan_s: float | None  # None when the rule did not need it


def expected_wan_s(missing_tokens: int, timing: TimingConfig, wan_gbit: float,
                   rtt_s: float) -> float:
    """Nominal missing KV bytes over the WAN estimate, plus one RTT."""
    nominal_bytes = missing_tokens * timing.token_scale * timing.kv_bytes_per_token
    return nominal_bytes * 8 / (wan_gbit * 1e9) + rtt_s


def choose_pipeline(mode: Mode, cfg: RouterConfig, timing: TimingConfig, inp: RouteInputs,
                    wan_gbit: float) -> RouteDecision:
    """The pipeline of one request (see the module docstring)."""
    if mode == Mode.CROSS_DC_PD:
        return RouteDecision(Pipeline.P_MD, "baseline: all p-md", None)
    if mode == Mode.SAME_DC_PD:
        return RouteDecision(Pipeline.RLD_ONLY, "baseline: all same-DC", None)
    if (cfg.anomalous_filter and inp.prompt_len * timing.token_scale
            >= cfg.anomalous_min_input_tokens
            and inp.max_out < cfg.anomalous_max_output_tokens):
        return RouteDecision(Pipeline.RLD_ONLY, "anomalous: long input, short output", None)
    md_hit = inp.hit_tokens if inp.md_hit_tokens is None else inp.md_hit_tokens
    missing = max(0, inp.prompt_len - md_hit)
    expected = expected_wan_s(missing, timing, wan_gbit, cfg.wan_rtt_s)
    if expected < cfg.relay_threshold_s:
        return RouteDecision(Pipeline.P_MD, "short transfer", expected)
    if mode == Mode.P_RLD:
        return RouteDecision(Pipeline.RLD_ONLY, "long transfer: decode on RLD", expected)
    if inp.rld_active >= cfg.rld_max_active:
        return RouteDecision(Pipeline.P_MD, "long transfer, RLD full", expected)
    return RouteDecision(Pipeline.P_RLD_MD, "long transfer: relay", expected)


class WanEstimate:
    """EWMA of the WAN rate (nominal Gbit/s) from MD's KV transfer reports.

    A report of ``wire_bytes`` (emulated, i.e. modeled / k) received in
    ``transfer_s`` (MD: KV_NEED sent -> KV_DONE received) is a sample of
    ``wire_bytes * k * 8 / (transfer_s - rtt)``; transfers smaller than
    ``min_bytes`` or not longer than one RTT are ignored (latency-bound).
    Example: ``est = WanEstimate(RouterConfig(), 10.0); est.add(4_000_000, 0.5); est.gbit``.
    """

    def __init__(self, cfg: RouterConfig, kv_scale_k: float):
        self.cfg, self.k = cfg, kv_scale_k
        self.gbit = cfg.wan_prior_gbit
        self.n_samples = 0

    def add(self, wire_bytes: int, transfer_s: float) -> bool:
        """Fold one report in; False if it was not usable as a rate sample."""
        busy_s = transfer_s - self.cfg.wan_rtt_s
        if wire_bytes < self.cfg.wan_sample_min_bytes or busy_s <= 0:
            return False
        sample = wire_bytes * self.k * 8 / busy_s / 1e9
        a = self.cfg.wan_ewma_alpha
        self.gbit = sample if self.n_samples == 0 else a * sample + (1 - a) * self.gbit
        self.n_samples += 1
        return True


class PrefixMirror:
    """The router's copy of P's prefix cache: ``hit = mirror.route(prompt)``."""

    def __init__(self, block_size: int, capacity_tokens: int):
        self._tree = RadixCache(block_size, capacity_tokens)

    def route(self, prompt: Sequence[int]) -> int:
        """P's expected hit for ``prompt``; then record the prompt as P will (match + insert)."""
        hit = self.hit(prompt)
        self.record(prompt)
        return hit

    def hit(self, prompt: Sequence[int]) -> int:
        """The expected hit, without recording the prompt."""
        return self._tree.match(prompt).n_tokens

    def record(self, prompt: Sequence[int]) -> None:
        self._tree.insert(prompt)
