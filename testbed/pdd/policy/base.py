"""What a routing policy is: the router's inputs at decision time, and what it answers.

A policy is an object with ``decide(inp, cfg, timing) -> RouteDecision`` and,
optionally, ``place(candidates) -> Placement | None``. The router
(``roles/router.py``) calls ``place`` first, to pick the instances (which P, RLD
and MD: ``None`` keeps the router's own placement, ``default_placement``), then
computes what it predicts for those instances (``RouteInputs``: P's prefill, the WAN
and local transfer times, RLD's room, ...) and calls ``decide`` for the pipeline. It
records the decision (pipeline, reason, every input) as it always has.

What a policy may do: read its inputs and its own parameters, keep state of its own
between calls (it lives in the router process for the run). What it may not do:
I/O of any kind (files, sockets, clocks other than the inputs' times), blocking,
threads, or changing its inputs. It runs on the router's event loop, which serves
every request: a decision should take microseconds (PDD's rule takes ~10 us; the
router logs a decision over ``POLICY_BUDGET_S`` and records every decision's time
as ``policy_us``). A policy that raises fails that request only, with the error
in its record (``policy error: ...``); nothing else stops.

Example (a user policy; see examples/policies/)::

    class Cold(Policy):
        def __init__(self, max_hit: float = 0.5):
            self.max_hit = max_hit

        def decide(self, inp, cfg, timing):
            hit = inp.md_hit_tokens / max(1, inp.prompt_len)
            if hit < self.max_hit and inp.rld_room is None:
                return RouteDecision(Pipeline.P_RLD_MD, f"cold ({hit:.2f}): relay")
            return RouteDecision(Pipeline.P_MD, f"warm ({hit:.2f})")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from testbed.pdd.run.config import RouterConfig, TimingConfig

from testbed.types import Pipeline

POLICY_BUDGET_S = 0.001  # a decision over this is logged (the router serves every request)


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
    p_hit_tokens: int = 0  # of the prompt, in P's prefix cache (the router's mirror)
    md_hit_tokens: int = 0  # in MD's DRC or on its way there: what need not cross the WAN
    rld_active: int = 0  # requests the chosen RLD holds
    md_active: int = 0  # requests the chosen MD holds


@dataclass(frozen=True)
class RouteDecision:
    pipeline: Pipeline
    reason: str


@dataclass(frozen=True)
class PCandidate:
    name: str
    prefill_end_s: float  # when this request's prefill would end there (its queue + prefill)
    hit_tokens: int  # of the prompt in its prefix cache


@dataclass(frozen=True)
class DecoderCandidate:
    """A decoder a request may go to, with what choosing it costs the request (router's
    predictions, seconds on the run's clock: modeled compute is time-scaled, the WAN is
    the emulated one)."""

    name: str
    active: int  # requests it holds
    held_tokens: int = 0  # MD: of the prompt in its DRC or on its way there (RLD: 0)
    transfer_s: float = 0.0  # MD: what it lacks of the prompt's KV over the WAN at the
    # router's capacity estimate (RLD: 0, every RLD gets the whole prompt on one path)
    decode_s: float = 0.0  # the request's max_out decode steps in its batch, this request
    # added (the cost model's step at batch active + 1 and their summed contexts)
    delays_s: float = 0.0  # MD: what its transfer adds to the others sharing the WAN line
    # (transfer_s for each transfer in flight there: the line is one, so every byte
    # placed on it delays each of them as much; RLD: 0)

    @property
    def cost_s(self) -> float:
        """What placing the request here costs: the KV it must still move and its decode
        in this instance's batch (its own time), plus what its transfer adds to the
        transfers it shares the WAN line with."""
        return self.transfer_s + self.decode_s + self.delays_s


@dataclass(frozen=True)
class Candidates:
    """The live instances a request may be placed on (``place``'s input); each list is
    empty when no instance of that role is up."""

    prompt_len: int
    p: Sequence[PCandidate]
    rld: Sequence[DecoderCandidate]
    md: Sequence[DecoderCandidate]
    max_out: int = 0  # the request's output tokens at most


@dataclass(frozen=True)
class Placement:
    """Instance names, one per role (None: none of that role). Each must be one of the
    candidates' names, else the request fails with a policy error."""

    p: str | None
    rld: str | None
    md: str | None


def default_placement(c: Candidates) -> Placement:
    """The router's placement (every built-in policy's), each instance by what it costs
    the request, not by rank:

    - P: the one whose prefill would end first (its queue plus the prefill of what its
      prefix cache lacks: a held prefix is worth the prefill it saves, a queue what it
      delays), then the one holding more of the prompt;
    - MD: the least ``cost_s`` (the WAN time of the KV it lacks + the request's decode
      in its batch + ``delays_s``, what the transfer adds to the others on the line): a
      held prefix is worth the transfer it saves at the WAN's current rate, to this
      request and to every transfer that shares the line with it; a load is worth what
      its batch adds to the request's decode. A session's long prefix
      (seconds of WAN time) keeps it on the MD that holds it; a one-block common opening
      (milliseconds) loses to any load difference, so it cannot pin the fleet to one
      decoder. Then the one holding more, then the least loaded;
    - RLD: the least ``decode_s``, then the least loaded.

    Ties by name. The MD cost is the one Dynamo's KV router minimises (a weighted
    overlap plus load: docs/policies.md, "Placement"), in seconds instead of blocks, so
    a slow WAN weighs a held prefix more, and a congested line (many transfers sharing
    it, each delayed by what this one adds) more again. What a request adds to its
    batch-mates' steps is not priced: it is per-token time of requests already
    decoding, while a transfer delays first tokens."""
    p = min(c.p, default=None, key=lambda x: (round(x.prefill_end_s, 6), -x.hit_tokens, x.name))
    md = min(c.md, default=None,
             key=lambda x: (round(x.cost_s, 6), -x.held_tokens, x.active, x.name))
    rld = min(c.rld, default=None, key=lambda x: (round(x.decode_s, 6), x.active, x.name))
    return Placement(p and p.name, rld and rld.name, md and md.name)


class Policy:
    """Base class of routing policies (a policy need not subclass it: ``decide`` is what
    the router calls, ``place`` if present). Parameters are the constructor's keyword
    arguments (a scenario's ``params``)."""

    name = "policy"

    def place(self, candidates: Candidates) -> Placement | None:
        return None  # the router's placement (default_placement)

    def decide(self, inp: RouteInputs, cfg: RouterConfig, timing: TimingConfig) -> RouteDecision:
        raise NotImplementedError


def guard(inp: RouteInputs) -> RouteDecision | None:
    """The decisions every built-in policy but the baselines makes first: no live MD ->
    rld-only where RLD has room; a warm-up request -> p-md (it fills P's cache and MD's
    DRC). None: neither applies."""
    if not inp.md_live:
        if inp.rld_room is None:
            return RouteDecision(Pipeline.RLD_ONLY, "MAIN_DECODE down: decode on RLD")
        return RouteDecision(Pipeline.P_MD, f"MAIN_DECODE down and {inp.rld_room}")
    if inp.warmup:
        return RouteDecision(Pipeline.P_MD, "warm-up: p-md fills P's cache and MD's DRC")
    return None
