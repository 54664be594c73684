"""Runtime changes to a live network, without teardown.

Owns what the scenario runner (and a user in ``testbed shell``) may change
while traffic flows: a link's rate, delay, jitter, loss; link down/up; and
nothing else. Rates change the htb class in place (``change``); delay/loss
change the netem leaf (netem backend) or are sent to the WAN delay line
(userspace backend). Every applied change is appended to the events log
with its monotonic time, nominal and emulated values.

Example::

    set_link(net, "wan", rate_gbit=5, delay_ms=30)   # both directions
    link_down(net, "wan"); ...; link_up(net, "wan")
"""

from __future__ import annotations

import dataclasses

from testbed.errors import EmulationError
from testbed.net import naming, tc
from testbed.net.plan import Channel, Impairment
from testbed.net.shaping import Backend, htb_params
from testbed.spec.link import LossSpec
from testbed.spec.topology import gateway_name, host_ifname

CHANGEABLE = ("rate_gbit", "delay_ms", "jitter_ms", "loss_pct", "loss")


def delay_params(imp: Impairment, up: bool = True):
    """The userspace delay line's parameters for an impairment stage."""
    from testbed.net.impairments import DelayParams, JitterDistribution, LossModel

    loss = imp.loss
    return DelayParams(
        delay_ms=imp.delay_ms, jitter_ms=imp.jitter_ms,
        jitter_distribution=JitterDistribution(imp.distribution),
        loss_model=LossModel(loss.model), loss_pct=loss.pct, ge_p_pct=loss.p_pct, ge_r_pct=loss.r_pct,
        ge_bad_loss_pct=loss.bad_loss_pct, ge_good_loss_pct=loss.good_loss_pct,
        reorder_pct=imp.reorder_pct, limit_pkts=imp.limit_pkts, seed=imp.seed, up=up)


def _select(net, link: str) -> list[Channel]:
    chans = [c for c in net.channels.values() if c.link == link or c.id == link]
    if not chans:
        known = sorted({c.link for c in net.channels.values()})
        raise EmulationError(f"no link {link!r}; links: {', '.join(known)}")
    return chans


def set_link(net, link: str, **changes) -> list[Channel]:
    """Change rate_gbit/delay_ms/jitter_ms/loss_pct (or loss=LossSpec) of a link.

    ``link`` is "wan", "wan/a>b", "host:p1", "host:p1/up", "gw:a"... Values
    are nominal; the rate is emulated at rate/k.
    """
    bad = set(changes) - set(CHANGEABLE)
    if bad:
        raise EmulationError(f"cannot change {sorted(bad)} at runtime; changeable: {CHANGEABLE}")
    if "loss_pct" in changes:
        changes["loss"] = LossSpec("random", pct=changes.pop("loss_pct"))
    updated = []
    for ch in _select(net, link):
        spec = ch.spec.replace(**changes)
        new = dataclasses.replace(ch, spec=spec, htb=htb_params(spec.rate_gbit, net.plan.scale))
        if ch.impairment:
            new = dataclasses.replace(new, impairment=dataclasses.replace(
                ch.impairment, delay_ms=spec.delay_ms, jitter_ms=spec.jitter_ms, loss=spec.loss))
        elif spec != ch.spec.replace(rate_gbit=spec.rate_gbit):
            raise EmulationError(f"{ch.id}: delay/loss on host links needs the netem backend "
                                 f"(backend is {net.plan.backend.value})")
        _apply_change(net, ch, new)
        net.channels[ch.id] = new
        updated.append(new)
        net.events.record("set_link", channel=new.id, **{k: _plain(v) for k, v in changes.items()},
                          emulated_rate_gbit=new.htb.emulated_gbit, scale=net.plan.scale)
    return updated


def _plain(v):
    return dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v


def _apply_change(net, old: Channel, new: Channel) -> None:
    ipr, idx = net.ipr(new.node), net.ifindex(new.node, new.dev)
    if new.htb != old.htb:
        tc.change_rate(ipr, idx, new)
    if new.impairment != old.impairment:
        if net.plan.backend is Backend.NETEM:
            tc.change_leaf(ipr, idx, new, netem=True)
        else:
            _delay_line(net, new.id).set(delay_params(new.impairment, up=True))


def _delay_line(net, cid: str):
    from testbed.net.delayline import DelayLineControl

    return DelayLineControl(str(net.delay_lines[cid]))


def _far_port(net, ch: Channel) -> tuple[str | None, str]:
    """The interface that takes a link down: the WAN node's or the switch's side."""
    if ch.link == "wan":
        gws = [gateway_name(d.name) for d in net.plan.topology.datacenters]
        return naming.WAN_NODE, host_ifname(naming.WAN_NODE, gws.index(ch.node))
    up = ch if ch.direction == "down" else net.channels[f"{ch.link}/down"]
    return None, up.dev


def _set_state(net, link: str, state: str) -> None:
    ports = sorted({_far_port(net, ch) for ch in _select(net, link)}, key=str)
    for node, dev in ports:
        net.ipr(node).link("set", index=net.ifindex(node, dev), state=state)
    net.events.record(f"link_{state}", link=link, ports=[f"{n or 'root'}:{d}" for n, d in ports])


def link_down(net, link: str) -> None:
    """Cut a link (carrier lost on both ends; packets in flight are dropped)."""
    _set_state(net, link, "down")


def link_up(net, link: str) -> None:
    _set_state(net, link, "up")


def channel_counter(net, cid: str) -> dict:
    """Bytes/packets/drops sent so far on one channel (htb class stats)."""
    ch = net.channels[cid]
    return tc.class_stats(net.ipr(ch.node), net.ifindex(ch.node, ch.dev))


def channel_counters(net) -> dict[str, dict]:
    """Bytes/packets/drops sent so far on every channel (htb class stats)."""
    return {cid: tc.class_stats(net.ipr(ch.node), net.ifindex(ch.node, ch.dev))
            for cid, ch in net.channels.items()}
