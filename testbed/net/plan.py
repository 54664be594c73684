"""Topology -> network plan: an ordered tuple of small immutable steps.

Owns the translation of a validated Topology into what must exist: hosts,
switches, links, addresses, routes, sysctls, shaped channels and delay
lines. Pure: nothing here touches the kernel, so every plan is testable
without root and ``--dry-run`` can print it. ``testbed.net.apply`` carries a
plan out.

Shape (docs/design.md, "The emulated network"): each datacenter is a Linux
bridge with its hosts and a gateway ``gw{dc}``; the gateways reach each
other through the WAN node ``wan``. A *channel* is one shaped direction of a
link: htb (rate/k) on the sending interface's egress, with a leaf that is
either netem (delay, jitter, loss, reorder, duplication; netem backend) or a packet fifo
whose delay stage is the userspace delay line in the WAN node (userspace
backend).

Example::

    plan = plan_network(load_topology("topologies/two-dc.yaml"), "tb1a2b",
                        Backend.USERSPACE, scale=10.0, seed=1)
    for step in plan.steps: print(step)
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import EmulationError, PlanError
from testbed.net import naming
from testbed.net.shaping import (Backend, HtbParams, htb_params, in_flight_pkts,
                                 queue_limit_pkts)
from testbed.impairment import LinkSpec, LossSpec, check_delay_stage
from testbed.spec.topology import Topology, gateway_name, host_ifname

# Sysctls raised in every emulated host. The 16 MB default buffers cap TCP
# near 1.3 Gbit/s at 100 ms RTT; IPv6 is off so no stray solicitations
# cross the WAN; metrics are not cached between flows (calibration); a
# connection idle for an RTO keeps its window (as tuned DC and WAN hosts
# do): without it every KV transfer on the long-lived P -> MD connection
# after a pause restarts in slow start, ~10 RTTs before it reaches the line
# rate, which neither the baseline nor PDD would accept in production.
HOST_SYSCTLS = (
    ("net.ipv4.tcp_rmem", "4096 131072 536870912"),
    ("net.ipv4.tcp_wmem", "4096 131072 536870912"),
    ("net.core.rmem_max", "536870912"),
    ("net.core.wmem_max", "536870912"),
    ("net.ipv4.tcp_no_metrics_save", "1"),
    ("net.ipv4.tcp_slow_start_after_idle", "0"),
    ("net.ipv6.conf.all.disable_ipv6", "1"),
    ("net.ipv6.conf.default.disable_ipv6", "1"),
)


@dataclass(frozen=True)
class Impairment:
    """Backend-neutral delay/loss stage of one channel (emulated values)."""

    delay_ms: float
    jitter_ms: float
    distribution: str
    loss: LossSpec
    reorder_pct: float
    limit_pkts: int   # packets the stage may hold (in flight + queue)
    seed: int
    duplicate_pct: float = 0.0

    def __post_init__(self) -> None:  # same rules as the LinkSpec it comes from (SpecError)
        check_delay_stage(self.delay_ms, self.jitter_ms, self.distribution, self.loss,
                          self.reorder_pct, self.duplicate_pct)
        for name in ("limit_pkts", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name == "limit_pkts" else 0):
                raise PlanError(f"impairment: {name}: expected an integer >= "
                                f"{1 if name == 'limit_pkts' else 0}, got {v!r}")

    @classmethod
    def of(cls, spec: LinkSpec, limit_pkts: int, seed: int) -> "Impairment":
        """The delay/loss stage of one direction: the LinkSpec's values, limit and seed."""
        return cls(spec.delay_ms, spec.jitter_ms, spec.jitter_distribution, spec.loss,
                   spec.reorder_pct, limit_pkts, seed, spec.duplicate_pct)


@dataclass(frozen=True)
class Channel:
    """One shaped direction of a link."""

    link: str            # "wan" or "host:{name}" or "gw:{dc}"
    direction: str       # "a>b"/"b>a" for the WAN, "up"/"down" for host links
    node: str | None     # namespace of the shaped interface (None: root)
    dev: str
    spec: LinkSpec       # nominal, as the topology says
    htb: HtbParams
    queue_pkts: int      # htb leaf queue (bottleneck buffer)
    impairment: Impairment | None  # None: no delay/loss stage (userspace host links)
    delay_line: tuple[str, str] | None = None  # (in_dev, out_dev) in the WAN node

    @property
    def id(self) -> str:
        return f"{self.link}/{self.direction}"


@dataclass(frozen=True)
class AddNode:
    name: str
    kind: str  # "host", "gateway", "wan"


@dataclass(frozen=True)
class AddSwitch:
    name: str


@dataclass(frozen=True)
class AddLink:
    node1: str
    node2: str
    intf1: str
    intf2: str


@dataclass(frozen=True)
class SetAddress:
    node: str
    dev: str
    cidr: str


@dataclass(frozen=True)
class SetSysctls:
    node: str
    values: tuple[tuple[str, str], ...]  # (key, value) in order


@dataclass(frozen=True)
class AddRoute:
    node: str
    dst: str
    via: str


@dataclass(frozen=True)
class BridgePorts:
    node: str
    bridge: str
    ports: tuple[str, ...]


@dataclass(frozen=True)
class RawPorts:
    """Interfaces up with no address, promiscuous (delay line endpoints)."""

    node: str
    ports: tuple[str, ...]


@dataclass(frozen=True)
class Shape:
    channel: Channel


@dataclass(frozen=True)
class StartDelayLine:
    channel: Channel


Step = (AddNode | AddSwitch | AddLink | SetAddress | SetSysctls | AddRoute | BridgePorts
        | RawPorts | Shape | StartDelayLine)


@dataclass(frozen=True)
class NetworkPlan:
    topology: Topology
    prefix: str
    backend: Backend
    scale: float
    seed: int
    steps: tuple
    channels: tuple[Channel, ...] = field(default=())
    addresses: dict = field(default_factory=dict, compare=False)  # node -> ip (DC side)

    def channel(self, cid: str) -> Channel:
        for c in self.channels:
            if c.id == cid:
                return c
        raise KeyError(cid)


def select_channels(channels, link: str) -> list[Channel]:
    """The channels a name means: a link ("wan", "host:p1", "gw:a", both
    directions) or one channel ("wan/a>b", "host:p1/up"). The one lookup the
    runtime, the faults and the plan share; EmulationError names the links."""
    chans = [c for c in channels if c.link == link or c.id == link]
    if not chans:
        known = sorted({c.link for c in channels})
        raise EmulationError(f"no link {link!r}; links: {', '.join(known)} "
                             f"(a direction: LINK/a>b, LINK/up...)")
    return chans


def queue_rtt_ms(topo: Topology, link: str, wan_delays_ms: tuple[float, float]) -> float:
    """The RTT a channel's queue is sized for: the WAN's (sum of its two
    one-way delays, as they are now) for the WAN; the planned WAN RTT + 0.1 ms
    for intra-DC links (they feed that path)."""
    if link == "wan":
        return wan_delays_ms[0] + wan_delays_ms[1]
    return topo.wan.rtt_ms + 0.1


def sized_channel(link: str, direction: str, node: str | None, dev: str, spec: LinkSpec,
                  scale: float, rtt_ms: float, with_stage: bool, seed: int,
                  delay_line: tuple[str, str] | None = None) -> Channel:
    """One channel with its htb rate, BDP queue and delay stage sized from ``spec``."""
    htb = htb_params(spec.rate_gbit, scale)
    queue = queue_limit_pkts(htb.rate_bps, rtt_ms, spec.queue_limit_pkts)
    imp = None
    if with_stage:
        held = in_flight_pkts(htb.rate_bps, spec.delay_ms, spec.jitter_ms) + queue
        imp = Impairment.of(spec, held, seed)
    return Channel(link, direction, node, dev, spec, htb, queue, imp, delay_line)


def _channel(link: str, direction: str, node: str | None, dev: str, spec: LinkSpec,
             ctx: "_Ctx", rtt_ms: float, delay_line: tuple[str, str] | None = None) -> Channel:
    ch = sized_channel(link, direction, node, dev, spec, ctx.scale, rtt_ms,
                       ctx.backend is Backend.NETEM or delay_line is not None,
                       ctx.seed * 1000 + len(ctx.channels), delay_line)
    ctx.channels.append(ch)
    return ch


@dataclass
class _Ctx:
    topo: Topology
    prefix: str
    backend: Backend
    scale: float
    seed: int
    steps: list = field(default_factory=list)
    channels: list = field(default_factory=list)
    addresses: dict = field(default_factory=dict)


def _plan_dc(ctx: _Ctx, index: int) -> None:
    dc = ctx.topo.datacenters[index]
    other = ctx.topo.datacenters[1 - index]
    sw = naming.switch_name(ctx.prefix, dc.name)
    gw = gateway_name(dc.name)
    wan_net = ipaddress.ip_network(ctx.topo.wan.subnet)
    rtt = queue_rtt_ms(ctx.topo, "dc", (0.0, 0.0))  # intra-DC queues: for the path they feed
    s = ctx.steps
    s.append(AddSwitch(sw))
    members = [(h.name, "host", h.ip, h.link) for h in dc.hosts]
    members.append((gw, "gateway", dc.gateway_ip, dc.host_link))
    for port, (name, kind, ip, link) in enumerate(members, start=1):
        s.append(AddNode(name, kind))
        dev, sw_port = host_ifname(name, 0), naming.switch_port(ctx.prefix, dc.name, port)
        s.append(AddLink(name, sw, dev, sw_port))
        s.append(SetAddress(name, dev, f"{ip}/{dc.prefix_len}"))
        ctx.addresses[name] = ip
        sysctls = HOST_SYSCTLS + (("net.ipv4.ip_forward", "1"),) if kind == "gateway" \
            else HOST_SYSCTLS
        s.append(SetSysctls(name, sysctls))
        tag = f"gw:{dc.name}" if kind == "gateway" else f"host:{name}"
        s.append(Shape(_channel(tag, "up", name, dev, link, ctx, rtt)))
        s.append(Shape(_channel(tag, "down", None, sw_port, link, ctx, rtt)))
        if kind == "host":
            s.append(AddRoute(name, other.subnet, dc.gateway_ip))
            s.append(AddRoute(name, str(wan_net), dc.gateway_ip))


def _plan_wan(ctx: _Ctx) -> None:
    a, b = (gateway_name(d.name) for d in ctx.topo.datacenters)
    w = naming.WAN_NODE
    wan = ctx.topo.wan
    s = ctx.steps
    s.append(AddNode(w, "wan"))
    s.append(SetSysctls(w, HOST_SYSCTLS[-2:]))
    w0, w1 = host_ifname(w, 0), host_ifname(w, 1)
    s.append(AddLink(a, w, host_ifname(a, 1), w0))
    s.append(AddLink(b, w, host_ifname(b, 1), w1))
    wan_net = ipaddress.ip_network(wan.subnet)
    for index, gw in enumerate((a, b)):
        gw_wan_ip = str(wan_net[1 + index])
        s.append(SetAddress(gw, host_ifname(gw, 1), f"{gw_wan_ip}/{wan_net.prefixlen}"))
        s.append(AddRoute(gw, ctx.topo.datacenters[1 - index].subnet, str(wan_net[2 - index])))
        ctx.addresses[f"{gw}/wan"] = gw_wan_ip
    if ctx.backend is Backend.NETEM:
        s.append(BridgePorts(w, naming.WAN_BRIDGE, (w0, w1)))
        lines = (None, None)
    else:
        s.append(RawPorts(w, (w0, w1)))
        lines = ((w0, w1), (w1, w0))
    rtt = queue_rtt_ms(ctx.topo, "wan", (wan.a_to_b.delay_ms, wan.b_to_a.delay_ms))
    ab = _channel("wan", "a>b", a, host_ifname(a, 1), wan.a_to_b, ctx, rtt, lines[0])
    ba = _channel("wan", "b>a", b, host_ifname(b, 1), wan.b_to_a, ctx, rtt, lines[1])
    for ch in (ab, ba):
        s.append(Shape(ch))
        if ch.delay_line:
            s.append(StartDelayLine(ch))


def plan_network(topo: Topology, prefix: str, backend: Backend, scale: float,
                 seed: int = 1) -> NetworkPlan:
    """The ordered steps that build ``topo`` under run prefix ``prefix``."""
    if not 1 <= scale < float("inf"):  # also NaN
        raise PlanError(f"bandwidth scale k (--scale) must be a finite number >= 1, got {scale}")
    ctx = _Ctx(topo, prefix, backend, scale, seed)
    _plan_dc(ctx, 0)
    _plan_dc(ctx, 1)
    _plan_wan(ctx)
    return NetworkPlan(topo, prefix, backend, scale, seed, tuple(ctx.steps),
                       tuple(ctx.channels), ctx.addresses)


def plan_json(plan: NetworkPlan) -> str:
    """The plan as JSON lines (for --dry-run and metadata)."""
    def enc(o):
        if dataclasses.is_dataclass(o):
            return {"step": type(o).__name__, **{f.name: getattr(o, f.name)
                                                  for f in dataclasses.fields(o)}}
        if isinstance(o, Backend):
            return o.value
        if isinstance(o, Path):
            return str(o)
        raise TypeError(type(o))
    return "\n".join(json.dumps(s, default=enc) for s in plan.steps)
