"""Qdisc operations through pyroute2: htb root/class and the channel's leaf.

Owns the only tc calls of the project. Every shaped interface gets::

    htb 1: (default 1:10) -> class 1:10 (rate/ceil = nominal/k, burst)
                          -> leaf 10: netem (netem backend) | pfifo (userspace)

``replace`` is used on build so re-applying is safe; runtime changes use
``change`` so a bandwidth schedule never tears a qdisc down mid-run (the
runtime plans them with ``rate_request``/``leaf_request`` as data,
testbed/net/runtime.py, and sends them with ``call``).
"""

from __future__ import annotations

from testbed.errors import ApplyError
from testbed.net.encoders import netem_params
from testbed.net.netem import netem_request, register
from testbed.net.plan import Channel
from testbed.net.shaping import HtbParams

ROOT, CLASS, LEAF = "1:", "1:10", "10:"


def rate_request(htb: HtbParams) -> dict:
    """Keyword arguments of the htb class (``replace-class``/``change-class``)."""
    rate = f"{htb.rate_bps}bit"
    return dict(kind="htb", handle=CLASS, parent=ROOT, rate=rate, ceil=rate,
                burst=htb.burst_bytes, cburst=htb.burst_bytes)


def leaf_request(ch: Channel, netem: bool) -> dict:
    """Keyword arguments of the channel's leaf: netem (its stage) or pfifo (its queue)."""
    if netem:
        return dict(kind="netem", handle=LEAF, parent=CLASS,
                    **netem_request(netem_params(ch.impairment)))
    return dict(kind="pfifo", handle=LEAF, parent=CLASS, limit=ch.queue_pkts)


def call(ipr, command: str, index: int, request: dict) -> None:
    """``ipr.tc(command, index=..., **request)``; netem's encoder registered first."""
    if request.get("kind") == "netem":
        register()
    ipr.tc(command, index=index, **request)


def shape(ipr, index: int, ch: Channel, netem: bool) -> None:
    """Install htb + leaf on interface ``index`` for channel ``ch``."""
    try:
        ipr.tc("replace", kind="htb", index=index, handle=ROOT, default=0x10)
        call(ipr, "replace-class", index, rate_request(ch.htb))
        call(ipr, "replace", index, leaf_request(ch, netem))
    except Exception as e:  # NetlinkError or plugin error
        raise ApplyError(f"shape {ch.id} on {ch.node or 'root'}:{ch.dev}", e) from e


def class_stats(ipr, index: int) -> dict:
    """Bytes/packets/drops sent by the htb class (link byte accounting) and the bytes
    queued in its leaf now (``backlog``: the shaper is the bottleneck while it is > 0)."""
    for msg in ipr.get_classes(index=index):
        if msg.get_attr("TCA_KIND") == "htb":
            st = msg.get_attr("TCA_STATS2")
            basic = st.get_attr("TCA_STATS_BASIC") if st else None
            queue = st.get_attr("TCA_STATS_QUEUE") if st else None
            return {"bytes": basic["bytes"] if basic else 0,
                    "packets": basic["packets"] if basic else 0,
                    "drops": queue["drops"] if queue else 0,
                    "backlog": queue["backlog"] if queue else 0}
    return {"bytes": 0, "packets": 0, "drops": 0, "backlog": 0}
