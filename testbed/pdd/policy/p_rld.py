"""``p-rld``: the design the paper excludes. PDD's anomalous filter and short-transfer
test (``pdd.py``, steps 1-2), then every other request ``rld-only`` with no room
check: it shows RLD overloading."""

from __future__ import annotations

from testbed.pdd.policy.base import Policy, RouteDecision, RouteInputs, guard
from testbed.pdd.policy.pdd import anomalous, short_transfer
from testbed.pdd.run.config import RouterConfig, TimingConfig
from testbed.types import Pipeline


class PRld(Policy):
    name = "p-rld"

    def decide(self, inp: RouteInputs, cfg: RouterConfig, timing: TimingConfig) -> RouteDecision:
        if (d := guard(inp)) is not None:
            return d
        if anomalous(inp, cfg, timing):
            return RouteDecision(Pipeline.RLD_ONLY, "anomalous: long input, short output")
        short, why = short_transfer(inp, cfg)
        if short is not None:
            return short
        return RouteDecision(Pipeline.RLD_ONLY, f"{why}: decode on RLD")
