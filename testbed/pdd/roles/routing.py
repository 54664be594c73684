"""The router's per-request decision helpers, as pure functions (no I/O).

Owns ``choose_pipeline`` (a mode's built-in policy applied: the rules themselves,
PDD's and the baselines', are ``testbed/pdd/policy/``, one module each; the rule in
words: docs/pdd-roles.md, "Router rule"), ``InflightPrefixes``
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

Example::

    d = choose_pipeline(Mode.PDD, RouterConfig(), TimingConfig(),
                        RouteInputs(prompt_len=4096, max_out=512, wan_s=1.3,
                                    rld_decode_s=6.0, rld_room=None))
    d.pipeline, d.reason
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from testbed.pdd.policy import BUILTIN, RouteDecision, RouteInputs  # noqa: F401 (re-exported)
from testbed.pdd.run.config import RouterConfig, TimingConfig
from testbed.types import Mode
from testbed.pdd.compute.costmodel import CostModel
from testbed.pdd.compute.radix import RadixCache, common_prefix_of_keys, token_key


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
    """The pipeline ``mode``'s built-in policy chooses for one request."""
    return BUILTIN[mode.value]().decide(inp, cfg, timing)


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
