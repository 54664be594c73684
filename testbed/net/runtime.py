"""Runtime changes to a live network, without teardown: planned as data, then applied.

Owns what the scenario runner (and a user in ``testbed shell``) may change
while traffic flows: a link's rate, delay, jitter, loss; link down/up; and
nothing else. Each change is two steps:

- a pure plan (``plan_set_link``, ``plan_link_state``): the new channels and
  the ordered operations that carry them out, as data: ``TcCall`` (one
  pyroute2 ``IPRoute.tc`` call: the htb class in place, ``change-class``;
  the netem or pfifo leaf, ``change``), ``SetDelayLine`` (the parameters sent
  to the WAN delay line, userspace backend), ``SetLinkState`` (one
  ``IPRoute.link("set", state=...)``). Unit-tested without root against a
  recording fake of the pyroute2 calls (tests/unit/test_runtime_plan.py);
- a thin ``apply``: the calls, in order, each failure an ApplyError.

A delay or jitter change re-sizes the channel's queue and delay stage for
the new bandwidth-delay product (a WAN delay change re-sizes both WAN
directions, whose queues are sized for the WAN RTT); a rate-only change
keeps them (as the planner sized them). Every applied change is appended to
the events log with its monotonic time, nominal and emulated values.

Example::

    set_link(net, "wan", rate_gbit=5, delay_ms=30)   # both directions
    link_down(net, "wan"); ...; link_up(net, "wan")
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from testbed.errors import ApplyError, EmulationError
from testbed.net import naming, tc
from testbed.net.encoders import delay_params
from testbed.net.impairments import DelayParams
from testbed.net.plan import (Channel, Impairment, NetworkPlan, queue_rtt_ms, select_channels,
                              sized_channel)
from testbed.net.shaping import Backend, htb_params
from testbed.impairment import LossSpec
from testbed.spec.topology import gateway_name, host_ifname

CHANGEABLE = ("rate_gbit", "delay_ms", "jitter_ms", "loss_pct", "loss", "duplicate_pct")


@dataclass(frozen=True)
class TcCall:
    """``IPRoute(netns node).tc(command, index=ifindex(dev), **request)``."""

    node: str | None
    dev: str
    command: str
    request: dict
    what: str  # for the error message


@dataclass(frozen=True)
class SetDelayLine:
    """Send ``params`` to the delay line of channel ``cid`` (userspace backend)."""

    cid: str
    params: DelayParams


@dataclass(frozen=True)
class SetLinkState:
    """``IPRoute(netns node).link("set", index=ifindex(dev), state=state)``."""

    node: str | None
    dev: str
    state: str


Op = TcCall | SetDelayLine | SetLinkState


def plan_set_link(plan: NetworkPlan, channels: dict[str, Channel], link: str,
                  **changes) -> tuple[dict[str, Channel], tuple[Op, ...]]:
    """The channels after the change (only those that change) and the ops, in order.

    ``link`` is "wan", "wan/a>b", "host:p1", "host:p1/up", "gw:a"... Values
    are nominal (the rate is emulated at rate/k); ``loss_pct`` is random
    loss, ``loss`` a LossSpec. Invalid values raise SpecError (LinkSpec).
    """
    bad = set(changes) - set(CHANGEABLE)
    if bad:
        raise EmulationError(f"cannot change {sorted(bad)} at runtime; changeable: {CHANGEABLE}")
    if "loss_pct" in changes:
        changes["loss"] = LossSpec("random", pct=changes.pop("loss_pct"))
    specs = {ch.id: ch.spec.replace(**changes) for ch in select_channels(channels.values(), link)}
    for cid, spec in specs.items():
        ch = channels[cid]
        if ch.impairment is None and spec != ch.spec.replace(rate_gbit=spec.rate_gbit):
            raise EmulationError(f"{ch.id}: delay/loss on host links needs the netem backend "
                                 f"(backend is {plan.backend.value})")
    delay_changed = {cid for cid, spec in specs.items()
                     if (spec.delay_ms, spec.jitter_ms)
                     != (channels[cid].spec.delay_ms, channels[cid].spec.jitter_ms)}
    if any(channels[cid].link == "wan" for cid in delay_changed):  # the WAN RTT changed
        delay_changed |= {"wan/a>b", "wan/b>a"}
    wan_delays = tuple(specs.get(cid, channels[cid].spec).delay_ms
                       for cid in ("wan/a>b", "wan/b>a"))
    new = {}
    for cid in sorted(set(specs) | delay_changed, key=list(channels).index):
        ch, spec = channels[cid], specs.get(cid, channels[cid].spec)
        if cid in delay_changed:  # queue and stage follow the new BDP
            n = sized_channel(ch.link, ch.direction, ch.node, ch.dev, spec, plan.scale,
                              queue_rtt_ms(plan.topology, ch.link, wan_delays),
                              ch.impairment is not None,
                              ch.impairment.seed if ch.impairment else 0, ch.delay_line)
        else:  # rate, loss or duplication only: the queue stays as planned
            n = dataclasses.replace(ch, spec=spec, htb=htb_params(spec.rate_gbit, plan.scale))
            if ch.impairment:
                n = dataclasses.replace(n, impairment=Impairment.of(
                    spec, ch.impairment.limit_pkts, ch.impairment.seed))
        if n != ch:
            new[cid] = n
    ops: list[Op] = []
    for cid, n in new.items():
        ops += _change_ops(plan.backend, channels[cid], n)
    return new, tuple(ops)


def _change_ops(backend: Backend, old: Channel, new: Channel) -> list[Op]:
    netem = backend is Backend.NETEM
    ops: list[Op] = []
    if new.htb != old.htb:
        ops.append(TcCall(new.node, new.dev, "change-class", tc.rate_request(new.htb, netem),
                          f"change rate of {new.id}"))
    if new.queue_pkts != old.queue_pkts:
        ops.append(TcCall(new.node, new.dev, "change", tc.queue_request(new, netem),
                          f"change queue of {new.id}"))
    if new.impairment != old.impairment:
        ops.append(TcCall(new.node, new.dev, "change", tc.stage_request(new),
                          f"change impairment of {new.id}") if netem else
                   SetDelayLine(new.id, delay_params(new.impairment, up=True)))
    return ops


def _far_port(plan: NetworkPlan, channels: dict[str, Channel],
              ch: Channel) -> tuple[str | None, str]:
    """The interface that takes a link down: the WAN node's or the switch's side."""
    if ch.link == "wan":
        gws = [gateway_name(d.name) for d in plan.topology.datacenters]
        return naming.WAN_NODE, host_ifname(naming.WAN_NODE, gws.index(ch.node))
    down = ch if ch.direction == "down" else channels[f"{ch.link}/down"]
    return None, down.dev


def plan_link_state(plan: NetworkPlan, channels: dict[str, Channel], link: str,
                    state: str) -> tuple[SetLinkState, ...]:
    """The ports to set ``state`` ("up"/"down") on to cut or restore ``link``."""
    ports = sorted({_far_port(plan, channels, ch) for ch in select_channels(channels.values(),
                                                                            link)}, key=str)
    return tuple(SetLinkState(node, dev, state) for node, dev in ports)


def apply(net, ops) -> None:
    """Carry out planned ops on the live network, in order."""
    for op in ops:
        if isinstance(op, TcCall):
            try:
                tc.call(net.ipr(op.node), op.command, net.ifindex(op.node, op.dev), op.request)
            except Exception as e:  # NetlinkError or plugin error
                raise ApplyError(op.what, e) from e
        elif isinstance(op, SetDelayLine):
            _delay_line(net, op.cid).set(op.params)
        else:
            net.ipr(op.node).link("set", index=net.ifindex(op.node, op.dev), state=op.state)


def set_link(net, link: str, **changes) -> list[Channel]:
    """Change rate_gbit/delay_ms/jitter_ms/loss_pct (or loss=LossSpec)/duplicate_pct of a link.

    Returns the changed channels of ``link`` (the other WAN direction is
    re-sized too when a WAN delay changes, and logged as ``queue_resize``).
    """
    selected = {c.id for c in select_channels(net.channels.values(), link)}
    new, ops = plan_set_link(net.plan, net.channels, link, **dict(changes))
    apply(net, ops)
    net.channels.update(new)
    plain = {k: _plain(v) for k, v in changes.items()}
    for cid in [c for c in net.channels if c in selected or c in new]:
        ch = net.channels[cid]
        sizes = dict(queue_pkts=ch.queue_pkts,
                     stage_limit_pkts=ch.impairment.limit_pkts if ch.impairment else None)
        if cid in selected:
            net.events.record("set_link", channel=cid, **plain,
                              emulated_rate_gbit=ch.htb.emulated_gbit, scale=net.plan.scale,
                              **sizes)
        else:
            net.events.record("queue_resize", channel=cid, **sizes)
    return [net.channels[cid] for cid in net.channels if cid in selected]


def _plain(v):
    return dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v


def _delay_line(net, cid: str):
    from testbed.net.delayline import DelayLineControl

    return DelayLineControl(str(net.delay_lines[cid]))


def _set_state(net, link: str, state: str) -> None:
    ops = plan_link_state(net.plan, net.channels, link, state)
    apply(net, ops)
    net.events.record(f"link_{state}", link=link,
                      ports=[f"{op.node or 'root'}:{op.dev}" for op in ops])


def link_down(net, link: str) -> None:
    """Cut a link (carrier lost on both ends; packets in flight are dropped)."""
    _set_state(net, link, "down")


def link_up(net, link: str) -> None:
    _set_state(net, link, "up")


def channel_counter(net, cid: str) -> dict:
    """Bytes/packets/drops sent so far on one channel (htb class stats)."""
    ch = net.channels[cid]
    return tc.class_stats(net.ipr(ch.node), net.ifindex(ch.node, ch.dev))

