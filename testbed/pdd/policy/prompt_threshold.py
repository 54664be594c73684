"""``prompt-threshold``: relay a request whose modeled prompt is at least
``min_prompt_tokens`` long (prompt x token_scale), if RLD has room; the rest p-md. The
length cut-off of PrfaaS (arXiv 2604.15039), which sends a prefill across only above a
threshold t, applied to the relay: no WAN model, no margin."""

from __future__ import annotations

from testbed.pdd.policy.base import Policy, RouteDecision, RouteInputs, guard
from testbed.pdd.run.config import RouterConfig, TimingConfig
from testbed.types import Pipeline


class PromptThreshold(Policy):
    name = "prompt-threshold"

    def __init__(self, min_prompt_tokens: int = 32768):
        if isinstance(min_prompt_tokens, bool) or not isinstance(min_prompt_tokens, int) \
                or min_prompt_tokens < 0:
            raise ValueError(f"min_prompt_tokens must be an integer >= 0, got "
                             f"{min_prompt_tokens!r}")
        self.min_prompt_tokens = min_prompt_tokens

    def decide(self, inp: RouteInputs, cfg: RouterConfig, timing: TimingConfig) -> RouteDecision:
        if (d := guard(inp)) is not None:
            return d
        modeled = inp.prompt_len * timing.token_scale
        if modeled < self.min_prompt_tokens:
            return RouteDecision(Pipeline.P_MD, f"prompt {modeled} < {self.min_prompt_tokens} "
                                                "tokens: p-md")
        if inp.rld_room is not None:
            return RouteDecision(Pipeline.P_MD, f"prompt {modeled} tokens, {inp.rld_room}")
        return RouteDecision(Pipeline.P_RLD_MD, f"prompt {modeled} >= "
                                                f"{self.min_prompt_tokens} tokens: relay")
