"""A user routing policy: relay the requests whose prompt main decode lacks.

PDD's rule predicts the WAN time of each request's KV (capacity, RTT, the queue ahead,
a margin of recent errors). This one does not look at the WAN at all: it relays a
request when the share of its prompt that MD's decode-side cache (DRC) holds, or is
already receiving, is below ``max_md_hit`` (what must cross the WAN is the rest), and
when RLD has room; everything else goes P -> MD. A cold turn of a conversation crosses
its whole context; a warm one only its new tokens.

Used by examples/policies/compare.yaml (`testbed run examples/policies/compare.yaml`),
and documented in docs/policies.md, which has the measured table.
"""

from testbed.pdd.policy import Policy, RouteDecision
from testbed.types import Pipeline


class ColdPrompt(Policy):
    name = "cold-prompt"

    def __init__(self, max_md_hit: float = 0.5):
        if isinstance(max_md_hit, bool) or not isinstance(max_md_hit, (int, float)) \
                or not 0.0 <= max_md_hit <= 1.0:
            raise ValueError(f"max_md_hit must be a number in [0, 1], got {max_md_hit!r}")
        self.max_md_hit = float(max_md_hit)

    def decide(self, inp, cfg, timing):
        if inp.warmup or not inp.md_live:  # warm-ups fill MD's DRC; no MD: nothing to relay to
            return RouteDecision(Pipeline.P_MD if inp.md_live else Pipeline.RLD_ONLY,
                                 "warm-up" if inp.md_live else "MAIN_DECODE down")
        hit = inp.md_hit_tokens / max(1, inp.prompt_len)
        if hit >= self.max_md_hit:
            return RouteDecision(Pipeline.P_MD, f"MD holds {hit:.2f} of the prompt: p-md")
        if inp.rld_room is not None:
            return RouteDecision(Pipeline.P_MD, f"MD holds {hit:.2f}, {inp.rld_room}")
        return RouteDecision(Pipeline.P_RLD_MD, f"MD holds {hit:.2f} of the prompt: relay")
