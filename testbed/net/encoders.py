"""The two backends' encodings of one delay/loss stage, side by side.

A WAN direction's impairment is one type from YAML to the kernel: the
topology's ``LinkSpec`` (testbed/impairment.py, validated when built) becomes
the plan's ``Impairment`` (``Impairment.of``: the same values plus the
stage's packet limit and seed, testbed/net/plan.py); this module derives
each backend's parameters from that one ``Impairment``:

- ``netem_params``: netem's qdisc options (``NetemParams``, microseconds;
  encoded byte for byte by testbed/net/netem.py);
- ``delay_params``: the userspace delay line's parameters (``DelayParams``,
  the JSON the delay line takes on its command line and control socket,
  testbed/net/impairments.py).

Pure; nothing here touches the kernel.
"""

from __future__ import annotations

from testbed.net.impairments import DelayParams
from testbed.net.netem import NetemParams
from testbed.net.plan import Impairment


def netem_params(imp: Impairment) -> NetemParams:
    """netem's options for a stage; tc's rule: a distribution table only with a delay
    and a jitter (else 'uniform', which sends none)."""
    loss = imp.loss
    delay_us, jitter_us = int(round(imp.delay_ms * 1000)), int(round(imp.jitter_ms * 1000))
    return NetemParams(
        delay_us=delay_us, jitter_us=jitter_us,
        distribution=imp.distribution if delay_us > 0 and jitter_us > 0 else "uniform",
        loss_model=loss.model, loss_pct=loss.pct, ge_p_pct=loss.p_pct, ge_r_pct=loss.r_pct,
        ge_bad_loss_pct=loss.bad_loss_pct, ge_good_loss_pct=loss.good_loss_pct,
        reorder_pct=imp.reorder_pct, duplicate_pct=imp.duplicate_pct, limit_pkts=imp.limit_pkts,
        seed=imp.seed)


def delay_params(imp: Impairment, up: bool = True) -> DelayParams:
    """The userspace delay line's parameters for a stage (``up`` False: drop all)."""
    loss = imp.loss
    return DelayParams(
        delay_ms=imp.delay_ms, jitter_ms=imp.jitter_ms, jitter_distribution=imp.distribution,
        loss_model=loss.model, loss_pct=loss.pct, ge_p_pct=loss.p_pct, ge_r_pct=loss.r_pct,
        ge_bad_loss_pct=loss.bad_loss_pct, ge_good_loss_pct=loss.good_loss_pct,
        reorder_pct=imp.reorder_pct, duplicate_pct=imp.duplicate_pct, limit_pkts=imp.limit_pkts,
        seed=imp.seed, up=up)
