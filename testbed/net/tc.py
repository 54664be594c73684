"""Qdisc operations through pyroute2: htb root/class and the channel's leaf.

Owns the only tc calls of the project. Every shaped interface gets::

    htb 1: (default 1:10) -> class 1:10 (rate/ceil = nominal/k, burst)
                          -> leaf 10: netem (netem backend) | pfifo (userspace)

``replace`` is used on build so re-applying is safe; runtime changes use
``change`` so a bandwidth schedule never tears a qdisc down mid-run.
"""

from __future__ import annotations

from testbed.errors import ApplyError
from testbed.net.plan import Channel, Impairment
from testbed.net.shaping import HtbParams

ROOT, CLASS, LEAF = "1:", "1:10", "10:"


def _netem_params(imp: Impairment):
    from testbed.net.netem import NetemParams  # the netem encoder (pyroute2 plugin)

    loss = imp.loss
    return NetemParams(
        delay_us=int(round(imp.delay_ms * 1000)), jitter_us=int(round(imp.jitter_ms * 1000)),
        distribution=imp.distribution if imp.jitter_ms > 0 else "uniform",
        loss_model=loss.model, loss_pct=loss.pct, ge_p_pct=loss.p_pct, ge_r_pct=loss.r_pct,
        ge_bad_loss_pct=loss.bad_loss_pct, ge_good_loss_pct=loss.good_loss_pct,
        reorder_pct=imp.reorder_pct, limit_pkts=imp.limit_pkts, seed=imp.seed)


def _htb_kwargs(htb: HtbParams) -> dict:
    rate = f"{htb.rate_bps}bit"
    return dict(rate=rate, ceil=rate, burst=htb.burst_bytes, cburst=htb.burst_bytes)


def _leaf(ipr, command: str, index: int, ch: Channel, netem: bool) -> None:
    if netem:
        from testbed.net.netem import netem_request, register

        register()
        ipr.tc(command, kind="netem", index=index, handle=LEAF, parent=CLASS,
               **netem_request(_netem_params(ch.impairment)))
    else:
        ipr.tc(command, kind="pfifo", index=index, handle=LEAF, parent=CLASS,
               limit=ch.queue_pkts)


def shape(ipr, index: int, ch: Channel, netem: bool) -> None:
    """Install htb + leaf on interface ``index`` for channel ``ch``."""
    try:
        ipr.tc("replace", kind="htb", index=index, handle=ROOT, default=0x10)
        ipr.tc("replace-class", kind="htb", index=index, handle=CLASS, parent=ROOT,
               **_htb_kwargs(ch.htb))
        _leaf(ipr, "replace", index, ch, netem)
    except Exception as e:  # NetlinkError or plugin error
        raise ApplyError(f"shape {ch.id} on {ch.node or 'root'}:{ch.dev}", e) from e


def change_rate(ipr, index: int, ch: Channel) -> None:
    try:
        ipr.tc("change-class", kind="htb", index=index, handle=CLASS, parent=ROOT,
               **_htb_kwargs(ch.htb))
    except Exception as e:
        raise ApplyError(f"change rate of {ch.id}", e) from e


def change_leaf(ipr, index: int, ch: Channel, netem: bool) -> None:
    try:
        _leaf(ipr, "change", index, ch, netem)
    except Exception as e:
        raise ApplyError(f"change impairment of {ch.id}", e) from e


def unshape(ipr, index: int) -> None:
    """Remove the root qdisc (used when a host link is unshaped on purpose)."""
    try:
        ipr.tc("del", index=index, handle=ROOT, root=True)
    except Exception:  # noqa: BLE001 - absent is fine
        pass


def class_stats(ipr, index: int) -> dict:
    """Bytes/packets/drops sent by the htb class (link byte accounting)."""
    for msg in ipr.get_classes(index=index):
        if msg.get_attr("TCA_KIND") == "htb":
            st = msg.get_attr("TCA_STATS2")
            basic = st.get_attr("TCA_STATS_BASIC") if st else None
            queue = st.get_attr("TCA_STATS_QUEUE") if st else None
            return {"bytes": basic["bytes"] if basic else 0,
                    "packets": basic["packets"] if basic else 0,
                    "drops": queue["drops"] if queue else 0}
    return {"bytes": 0, "packets": 0, "drops": 0}
