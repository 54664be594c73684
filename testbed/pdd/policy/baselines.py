"""The baselines: every request over the WAN (``cross-dc-pd``, also named
``never-relay``), or every request on RLD as a same-DC decoder (``same-dc-pd``)."""

from __future__ import annotations

from testbed.pdd.policy.base import Policy, RouteDecision, RouteInputs
from testbed.pdd.run.config import RouterConfig, TimingConfig
from testbed.types import Pipeline


class CrossDcPd(Policy):
    name = "cross-dc-pd"

    def decide(self, inp: RouteInputs, cfg: RouterConfig, timing: TimingConfig) -> RouteDecision:
        return RouteDecision(Pipeline.P_MD, "baseline: all p-md")


class NeverRelay(CrossDcPd):
    """``cross-dc-pd``'s decisions under a policy name, beside other policies."""

    name = "never-relay"


class SameDcPd(Policy):
    name = "same-dc-pd"

    def decide(self, inp: RouteInputs, cfg: RouterConfig, timing: TimingConfig) -> RouteDecision:
        return RouteDecision(Pipeline.RLD_ONLY, "baseline: all same-DC")
