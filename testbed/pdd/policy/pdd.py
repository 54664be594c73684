"""PDD's rule (``pdd`` mode): relay when relaying gains enough, within RLD's capacity.

In order (docs/pdd-roles.md, "Router rule"), after ``guard`` (MD down, warm-up):

1. anomalous filter (``anomalous_filter``): modeled prompt >=
   ``anomalous_min_input_tokens`` and max output < ``anomalous_max_output_tokens`` ->
   ``rld-only`` (``p-md`` if RLD has no room);
2. what relaying gains < ``relay_threshold_s`` -> ``p-md``, unless the WAN is lossy
   (``wan_retrans_share`` >= ``lossy_wan_retrans_pct``: under random loss a
   transfer's time is set by retransmission timeouts the prediction cannot see).
   The gain is the predicted WAN time plus the margin minus the predicted local time;
3. RLD has no room -> ``p-md`` (wait for the WAN rather than overload RLD);
4. (``late_kv_local``) the KV would reach MD after RLD has decoded every token ->
   ``rld-only`` (the KV does not cross);
5. otherwise ``p-rld-md``.

``PRld`` (``p-rld``, the design the paper excludes) shares steps 1-2 and sends the
rest ``rld-only`` with no room check.
"""

from __future__ import annotations

from testbed.pdd.policy.base import Policy, RouteDecision, RouteInputs, guard
from testbed.pdd.run.config import RouterConfig, TimingConfig
from testbed.types import Pipeline


def short_transfer(inp: RouteInputs, cfg: RouterConfig) -> tuple[RouteDecision | None, str]:
    """Step 2: (p-md decision, or None to go on; why the request is not short)."""
    gain = inp.wan_s + inp.wan_margin_s - inp.local_s
    lossy = (cfg.lossy_wan_retrans_pct > 0
             and 100 * inp.wan_retrans_share >= cfg.lossy_wan_retrans_pct)
    if gain < cfg.relay_threshold_s and not lossy:
        return RouteDecision(Pipeline.P_MD, f"short transfer: relaying gains {gain:.2f} s "
                                            f"({inp.wan_s:.2f} s + margin "
                                            f"{inp.wan_margin_s:.2f} s - local "
                                            f"{inp.local_s:.2f} s)"), ""
    why = (f"long transfer ({inp.wan_s:.2f} s)" if gain >= cfg.relay_threshold_s else
           f"lossy WAN ({100 * inp.wan_retrans_share:.1f}% of segments retransmitted; "
           f"relaying gains {gain:.2f} s as predicted)")
    return None, why


def anomalous(inp: RouteInputs, cfg: RouterConfig, timing: TimingConfig) -> bool:
    """Step 1's test: a long input with a short output."""
    return (cfg.anomalous_filter
            and inp.prompt_len * timing.token_scale >= cfg.anomalous_min_input_tokens
            and inp.max_out < cfg.anomalous_max_output_tokens)


class PddRule(Policy):
    name = "pdd"

    def decide(self, inp: RouteInputs, cfg: RouterConfig, timing: TimingConfig) -> RouteDecision:
        if (d := guard(inp)) is not None:
            return d
        if anomalous(inp, cfg, timing):
            if inp.rld_room is not None:
                return RouteDecision(Pipeline.P_MD, f"anomalous, but {inp.rld_room}")
            return RouteDecision(Pipeline.RLD_ONLY, "anomalous: long input, short output")
        short, why = short_transfer(inp, cfg)
        if short is not None:
            return short
        if inp.rld_room is not None:
            return RouteDecision(Pipeline.P_MD, f"{why}, {inp.rld_room}")
        late_s = inp.wan_s if inp.late_wan_s is None else inp.late_wan_s
        if cfg.late_kv_local and late_s >= inp.rld_decode_s:
            return RouteDecision(Pipeline.RLD_ONLY,
                                 f"KV would reach MD ({late_s:.2f} s) after RLD's last token "
                                 f"({inp.rld_decode_s:.2f} s): no WAN transfer")
        return RouteDecision(Pipeline.P_RLD_MD, f"{why}: relay")
