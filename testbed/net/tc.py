"""Qdisc operations through pyroute2: the shaper (htb class + packet fifo) and, with
the netem backend, netem's delay stage in front of it.

Owns the only tc calls of the project. Every shaped interface gets::

    userspace:  htb 1: (default 1:10) -> class 1:10 (rate/ceil = nominal/k, burst)
                                      -> leaf 10: pfifo (the bottleneck queue)
                (the delay stage is the userspace delay line in the WAN node)
    netem:      netem 1: (delay, jitter, loss, reorder, duplication)
                  -> htb 2: (default 2:10) -> class 2:10 (rate/ceil, burst)
                                           -> leaf 20: pfifo (the bottleneck queue)

The shaper's queue is the same pfifo on both backends, so the htb class's counters
mean the same: bytes sent at the shaped rate, drops of its full queue, and a
backlog that holds only what waits for the rate limiter. netem delays first and
hands each packet to its child when the delay is over; a packet held for its
delay is in netem's queue, never in the shaper's. (With netem as the htb class's
leaf, as this layout was until 2026-12, a packet held for its delay read as a
shaper backlog and the fidelity check judged idle links as starved shapers.)
Delay then rate, or rate then delay: a packet's time through the link is the
same; only where it waits differs.

``replace`` is used on build so re-applying is safe; runtime changes use
``change`` so a bandwidth schedule never tears a qdisc down mid-run (the
runtime plans them with ``rate_request``/``queue_request``/``stage_request`` as
data, testbed/net/runtime.py, and sends them with ``call``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyroute2.netlink.rtnl import TC_H_ROOT

from testbed.errors import ApplyError
from testbed.net.encoders import netem_params
from testbed.net.netem import netem_request, register
from testbed.net.plan import Channel
from testbed.net.shaping import HtbParams


@dataclass(frozen=True)
class Layout:
    """The handles of one shaped interface's qdiscs."""

    stage: str | None  # netem at the root (netem backend), else none
    root: str          # the htb qdisc
    cls: str           # its one class: the shaper
    leaf: str          # the class's pfifo: the shaper's queue

    @property
    def htb_parent(self) -> str | int:
        return self.stage.rstrip(":") + ":1" if self.stage else TC_H_ROOT


USERSPACE = Layout(None, "1:", "1:10", "10:")
NETEM = Layout("1:", "2:", "2:10", "20:")


def layout(netem: bool) -> Layout:
    return NETEM if netem else USERSPACE


def rate_request(htb: HtbParams, netem: bool) -> dict:
    """Keyword arguments of the htb class (``replace-class``/``change-class``)."""
    lay, rate = layout(netem), f"{htb.rate_bps}bit"
    return dict(kind="htb", handle=lay.cls, parent=lay.root, rate=rate, ceil=rate,
                burst=htb.burst_bytes, cburst=htb.burst_bytes)


def queue_request(ch: Channel, netem: bool) -> dict:
    """Keyword arguments of the shaper's queue: a pfifo of the channel's queue_pkts."""
    lay = layout(netem)
    return dict(kind="pfifo", handle=lay.leaf, parent=lay.cls, limit=ch.queue_pkts)


def stage_request(ch: Channel) -> dict:
    """Keyword arguments of the netem delay stage at the root (netem backend)."""
    return dict(kind="netem", handle=NETEM.stage, parent=TC_H_ROOT,
                **netem_request(netem_params(ch.impairment)))


def call(ipr, command: str, index: int, request: dict) -> None:
    """``ipr.tc(command, index=..., **request)``; netem's encoder registered first."""
    if request.get("kind") == "netem":
        register()
    ipr.tc(command, index=index, **request)


def shape(ipr, index: int, ch: Channel, netem: bool) -> None:
    """Install the channel's qdiscs on interface ``index`` (the layouts above)."""
    lay = layout(netem)
    try:
        if netem:
            call(ipr, "replace", index, stage_request(ch))
        ipr.tc("replace", kind="htb", index=index, handle=lay.root, parent=lay.htb_parent,
               default=0x10)
        call(ipr, "replace-class", index, rate_request(ch.htb, netem))
        call(ipr, "replace", index, queue_request(ch, netem))
    except Exception as e:  # NetlinkError or plugin error
        raise ApplyError(f"shape {ch.id} on {ch.node or 'root'}:{ch.dev}", e) from e


def class_stats(ipr, index: int) -> dict:
    """Bytes/packets/drops sent by the htb class (link byte accounting) and the bytes
    queued in its pfifo now (``backlog``: what waits for the rate limiter; the shaper
    is the bottleneck while it is > 0). On either backend, a packet held for its delay
    is not in it."""
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
