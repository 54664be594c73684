"""The router's per-request pipeline decision, as pure functions (no I/O).

Owns ``choose_pipeline`` (the rule of docs/pdd-roles.md), ``InflightPrefixes``
(which prompts' KV is on its way to each MD), ``RldBudget``
(what RLD can hold: its decode batch and its KV memory, from the cost
model of GPU_A) and ``PrefixMirror`` (the router's radix mirror of P's
prefix cache: same block size and capacity, fed with every routed prompt
in routing order, which is P's FIFO order, so its LRU evicts what P's
evicts). The router keeps one more mirror per MD, of its DRC: MD fetches
over the WAN only what its DRC lacks, and the DRC falls behind P's cache
whenever a request never reaches MD (anomalous, rld-only), so P's hit
alone underestimates the transfer. The WAN time itself comes from
``wan_model.WanModel`` (capacity, RTT and the KV backlog ahead).

Rule, per mode:

- ``cross-dc-pd``: always ``p-md``; ``same-dc-pd``: always ``rld-only``.
- no live MAIN_DECODE (``md_live`` false) -> ``rld-only`` if RLD has room
  (else ``p-md``, which the router fails for want of MD) in every other mode.
- a warm-up request (metadata ``warmup``; it puts a shared system prompt in
  P's cache and MD's DRC before the measured requests) -> ``p-md`` in every
  other mode.
- ``pdd``: in order,
  1. anomalous filter (when on): modeled prompt >= ``anomalous_min_input_tokens``
     and max output < ``anomalous_max_output_tokens`` -> ``rld-only``
     (``p-md`` if RLD has no room);
  2. what relaying gains < ``relay_threshold_s`` -> ``p-md``, unless the WAN
     is lossy (P's connections to MD retransmitted at least
     ``lossy_wan_retrans_pct`` of their segments over ``lossy_wan_window_s``,
     ``wan_loss.LossMeter``): then a short transfer goes on to steps 3-5 as a
     long one would, because under loss its time is set by retransmission
     timeouts the prediction cannot see (measured: ``wan_loss``). The gain is
     the predicted WAN time (prefill end -> KV at MD) plus the margin
     (``wan_margin_s``: a high quantile of recent near-threshold prediction
     errors, see ``wan_model``) minus the predicted local time (prefill end
     -> KV at RLD, ``local_s``, see ``local_model``: RLD has no prefix cache,
     so the whole prompt crosses the local path, and a high-hit request's
     local transfer takes as long as its WAN one);
  3. RLD has no room (batch or KV memory of ``RldBudget``, or
     ``rld_max_active``) -> ``p-md``: wait for the WAN rather than
     overload RLD (the collapse the paper excludes P->RLD to avoid);
  4. (``late_kv_local``, on by default) the KV would reach MD after RLD has
     decoded every token (predicted WAN time >= ``max_out`` x RLD's step
     time) -> ``rld-only``: relaying would decode it all on RLD anyway, so
     the KV does not cross. This test's WAN time (``late_wan_s``) is
     predicted on the capacity estimate returning toward the line rate
     while no transfer measures it (``WanModel.recovered_gbit``): an
     rld-only request sends nothing, so a stale low estimate would
     otherwise never be corrected;
  5. otherwise ``p-rld-md``.
- ``p-rld``: the anomalous filter, then step 2, then ``rld-only`` with no
  room check (the design the paper excludes because it overloads RLD).

Example::

    d = choose_pipeline(Mode.PDD, RouterConfig(), TimingConfig(),
                        RouteInputs(prompt_len=4096, max_out=512, wan_s=1.3,
                                    rld_decode_s=6.0, rld_room=None))
    d.pipeline, d.reason
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from testbed.pdd.run.config import Mode, Pipeline, RouterConfig, TimingConfig
from testbed.pdd.compute.costmodel import CostModel
from testbed.pdd.compute.radix import RadixCache, common_prefix_of_keys, token_key


@dataclass(frozen=True)
class RouteInputs:
    """What the router knows about a request when routing it."""

    prompt_len: int
    max_out: int
    wan_s: float  # predicted prefill end -> KV complete at MD (wan_model)
    rld_decode_s: float  # RLD's time to decode all max_out tokens (modeled, time-scaled)
    rld_room: str | None  # None: RLD can take it; else why not
    warmup: bool = False  # a warm-up request (client metadata)
    wan_margin_s: float = 0.0  # what the threshold test adds to wan_s (WanModel.margin_s)
    md_live: bool = True  # a MAIN_DECODE instance is up
    local_s: float = 0.0  # predicted prefill end -> KV complete at RLD (local_model)
    late_wan_s: float | None = None  # the late-KV rule's WAN time (None: wan_s), predicted
    # on the capacity estimate returning toward the line (wan_model.recovered_gbit)
    wan_retrans_share: float = 0.0  # P's retransmitted / sent segments to MD, recent (wan_loss)


@dataclass(frozen=True)
class RouteDecision:
    pipeline: Pipeline
    reason: str


@dataclass(frozen=True)
class RldBudget:
    """What one RLD instance holds at most: a decode batch whose step stays within
    ``router.rld_step_budget_ms`` at the longest context, and the modeled KV
    tokens its memory holds (``CostModel.kv_capacity_tokens``).

    Example: ``RldBudget.of(cfg.timing.cost(Role.RELAY_DECODE), cfg.router, 2048)``.
    """

    max_batch: int
    kv_tokens: int

    @classmethod
    def of(cls, cost: CostModel, cfg: RouterConfig, max_context: int) -> "RldBudget":
        batch = cost.max_batch(max_context, cfg.rld_step_budget_ms / 1e3)
        if cfg.rld_max_active:
            batch = min(batch, cfg.rld_max_active)
        return cls(batch, cost.kv_capacity_tokens())

    def room(self, active: int, held_tokens: int, new_tokens: int) -> str | None:
        """None if a request of ``new_tokens`` (modeled KV) fits; else why not."""
        if active + 1 > self.max_batch:
            return f"RLD full: batch {active} of {self.max_batch}"
        if held_tokens + new_tokens > self.kv_tokens:
            return f"RLD full: KV {held_tokens} + {new_tokens} of {self.kv_tokens} tokens"
        return None


def choose_pipeline(mode: Mode, cfg: RouterConfig, timing: TimingConfig,
                    inp: RouteInputs) -> RouteDecision:
    """The pipeline of one request (see the module docstring)."""
    if mode == Mode.CROSS_DC_PD:
        return RouteDecision(Pipeline.P_MD, "baseline: all p-md")
    if mode == Mode.SAME_DC_PD:
        return RouteDecision(Pipeline.RLD_ONLY, "baseline: all same-DC")
    if not inp.md_live:
        if inp.rld_room is None:
            return RouteDecision(Pipeline.RLD_ONLY, "MAIN_DECODE down: decode on RLD")
        return RouteDecision(Pipeline.P_MD, f"MAIN_DECODE down and {inp.rld_room}")
    if inp.warmup:
        return RouteDecision(Pipeline.P_MD, "warm-up: p-md fills P's cache and MD's DRC")
    guard = mode == Mode.PDD
    if (cfg.anomalous_filter and inp.prompt_len * timing.token_scale
            >= cfg.anomalous_min_input_tokens
            and inp.max_out < cfg.anomalous_max_output_tokens):
        if guard and inp.rld_room is not None:
            return RouteDecision(Pipeline.P_MD, f"anomalous, but {inp.rld_room}")
        return RouteDecision(Pipeline.RLD_ONLY, "anomalous: long input, short output")
    gain = inp.wan_s + inp.wan_margin_s - inp.local_s
    lossy = (cfg.lossy_wan_retrans_pct > 0
             and 100 * inp.wan_retrans_share >= cfg.lossy_wan_retrans_pct)
    if gain < cfg.relay_threshold_s and not lossy:
        return RouteDecision(Pipeline.P_MD, f"short transfer: relaying gains {gain:.2f} s "
                                            f"({inp.wan_s:.2f} s + margin "
                                            f"{inp.wan_margin_s:.2f} s - local "
                                            f"{inp.local_s:.2f} s)")
    why = (f"long transfer ({inp.wan_s:.2f} s)" if gain >= cfg.relay_threshold_s else
           f"lossy WAN ({100 * inp.wan_retrans_share:.1f}% of segments retransmitted; "
           f"relaying gains {gain:.2f} s as predicted)")
    if not guard:
        return RouteDecision(Pipeline.RLD_ONLY, f"{why}: decode on RLD")
    if inp.rld_room is not None:
        return RouteDecision(Pipeline.P_MD, f"{why}, {inp.rld_room}")
    late_s = inp.wan_s if inp.late_wan_s is None else inp.late_wan_s
    if cfg.late_kv_local and late_s >= inp.rld_decode_s:
        return RouteDecision(Pipeline.RLD_ONLY,
                             f"KV would reach MD ({late_s:.2f} s) after RLD's last token "
                             f"({inp.rld_decode_s:.2f} s): no WAN transfer")
    return RouteDecision(Pipeline.P_RLD_MD, f"{why}: relay")


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


class InflightPrefixes:
    """KV on its way to each MD: ``{md: {rid: (prompt, predicted arrival)}}``.

    MD waits for an in-flight prefix instead of fetching it again (a next turn
    routed while the previous turn's KV crosses needs only the rest), so the
    router predicts such a request from that transfer's arrival.
    """

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._by_md: dict[str, dict[int, tuple[bytes, float]]] = {}

    def add(self, md: str, rid: int, prompt: Sequence[int], arrival_s: float) -> None:
        self._by_md.setdefault(md, {})[rid] = (token_key(prompt), arrival_s)

    def longest(self, md: str | None, prompt: Sequence[int]) -> tuple[int, float]:
        """(longest block-aligned prefix of ``prompt`` on its way to ``md``, that
        transfer's predicted arrival); (0, 0.0) if none."""
        inflight = self._by_md.get(md)
        if not inflight:
            return (0, 0.0)
        bs, best, key = self.block_size, (0, 0.0), token_key(prompt)
        for other, arrival in inflight.values():
            n = common_prefix_of_keys(key, other) // bs * bs
            if n > best[0]:
                best = (n, arrival)
        return best

    def remove(self, rid: int) -> None:
        for inflight in self._by_md.values():
            inflight.pop(rid, None)

    def forget_md(self, md: str) -> None:
        """``md`` restarted: nothing is on its way to it any more."""
        self._by_md.pop(md, None)
