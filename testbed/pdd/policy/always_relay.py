"""``always-relay``: every request P -> RLD -> MD, whatever the WAN and RLD's load (no
room check: it shows what relaying everything costs RLD). MD down and warm-up
requests as every built-in (``base.guard``)."""

from __future__ import annotations

from testbed.pdd.policy.base import Policy, RouteDecision, RouteInputs, guard
from testbed.pdd.run.config import RouterConfig, TimingConfig
from testbed.types import Pipeline


class AlwaysRelay(Policy):
    name = "always-relay"

    def decide(self, inp: RouteInputs, cfg: RouterConfig, timing: TimingConfig) -> RouteDecision:
        if (d := guard(inp)) is not None:
            return d
        return RouteDecision(Pipeline.P_RLD_MD, "always-relay: relay")
