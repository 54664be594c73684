"""Topology specs: two datacenters joined by a WAN through a WAN node.

Owns Role, HostSpec, DatacenterSpec, WanSpec, Topology and
``load_topology``. The physical shape is fixed (docs/design.md, "The
emulated network"): every datacenter is one switch with its hosts and a
gateway; the two gateways meet through the WAN node, which carries the WAN's
impairments. The file chooses hosts, roles, subnets and link parameters.
Host names become interface names inside the host's namespace
(``{host}-eth{n}``), hence the 15-character kernel limit.

Example::

    topo = load_topology("topologies/two-dc.yaml")
    topo.wan.a_to_b.rate_gbit      # 10.0
    topo.hosts_with(Role.MAIN_DECODE)
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import SpecError
from testbed.impairment import LinkSpec
from testbed.spec.link import parse_link
from testbed.reader import Fields, load_yaml

IFNAMSIZ = 15  # usable characters in a Linux interface name
NAME_RE = re.compile(r"^[a-z][a-z0-9]*$")
RESERVED_NAMES = ("wan",)  # plus gw{dc}, see gateway_name
DEFAULT_HOST_LINK = LinkSpec(rate_gbit=100.0, delay_ms=0.005)
MAX_DATACENTERS = 2


class Role(enum.Enum):
    PREFILL = "prefill"
    RELAY_DECODE = "relay_decode"
    MAIN_DECODE = "main_decode"
    ROUTER = "router"
    CLIENT = "client"
    CROSS_TRAFFIC = "cross_traffic"


def gateway_name(dc: str) -> str:
    return f"gw{dc}"


def host_ifname(host: str, index: int) -> str:
    return f"{host}-eth{index}"


@dataclass(frozen=True)
class HostSpec:
    name: str
    dc: str
    roles: tuple[Role, ...]
    ip: str
    link: LinkSpec  # host <-> DC switch, both directions


@dataclass(frozen=True)
class DatacenterSpec:
    name: str
    subnet: str  # e.g. 10.10.1.0/24
    gateway_ip: str
    host_link: LinkSpec  # default for hosts and for the gateway's DC side
    hosts: tuple[HostSpec, ...]

    @property
    def prefix_len(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen


@dataclass(frozen=True)
class WanSpec:
    subnet: str
    a_to_b: LinkSpec
    b_to_a: LinkSpec

    @property
    def rtt_ms(self) -> float:
        return self.a_to_b.delay_ms + self.b_to_a.delay_ms


@dataclass(frozen=True)
class Topology:
    name: str
    file: str
    description: str
    datacenters: tuple[DatacenterSpec, DatacenterSpec]
    wan: WanSpec

    @property
    def hosts(self) -> tuple[HostSpec, ...]:
        return tuple(h for dc in self.datacenters for h in dc.hosts)

    def host(self, name: str) -> HostSpec:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def hosts_with(self, role: Role) -> tuple[HostSpec, ...]:
        return tuple(h for h in self.hosts if role in h.roles)

    def dc(self, name: str) -> DatacenterSpec:
        return next(d for d in self.datacenters if d.name == name)

    def with_wan(self, **changes) -> "Topology":
        """Same topology with both WAN directions changed (e.g. rate_gbit=40)."""
        wan = WanSpec(self.wan.subnet, self.wan.a_to_b.replace(**changes),
                      self.wan.b_to_a.replace(**changes))
        return dataclasses.replace(self, wan=wan)


def _name_problem(name: str) -> str | None:
    if not NAME_RE.match(name):
        return "a lowercase name of letters and digits starting with a letter"
    ifname = host_ifname(name, 0)
    if len(ifname) > IFNAMSIZ:
        return (f"a name whose interface name {ifname!r} fits in {IFNAMSIZ} characters "
                f"(it has {len(ifname)})")
    return None


def _parse_network(f: Fields, key: str) -> ipaddress.IPv4Network:
    raw = f.str(key)
    try:
        net = ipaddress.IPv4Network(raw, strict=True)
    except ValueError as e:
        raise f.error(key, "an IPv4 network like 10.10.1.0/24", f"{raw} ({e})") from None
    if not net.is_private or net.prefixlen > 29:
        raise f.error(key, "a private IPv4 network of at least /29", raw)
    return net


def _parse_host(f: Fields, dc: str, net: ipaddress.IPv4Network, auto_ip: str,
                base_link: LinkSpec) -> HostSpec:
    name = f.str("name", check=_name_problem)
    roles_raw = f.list("roles", min_len=1)
    roles = []
    for i, r in enumerate(roles_raw):
        try:
            roles.append(Role(r))
        except ValueError:
            raise SpecError(f.file, f"{f.where('roles')}[{i}]",
                            "one of " + ", ".join(x.value for x in Role), r) from None
    ip = f.str("ip", auto_ip)
    try:
        addr = ipaddress.IPv4Address(ip)
    except ValueError:
        raise f.error("ip", "an IPv4 address", ip) from None
    if addr not in net or addr in (net.network_address, net.broadcast_address, net[1]):
        raise f.error("ip", f"a host address in {net} other than the gateway {net[1]}", ip)
    link = parse_link(f.sub("link"), DEFAULT_HOST_LINK if base_link is None else base_link) \
        if f.has("link") else base_link
    f.done()
    return HostSpec(name, dc, tuple(roles), ip, link)


def _parse_dc(f: Fields) -> DatacenterSpec:
    name = f.str("name", check=lambda s: None if NAME_RE.match(s) and len(s) <= 4
                 else "a lowercase name of at most 4 letters/digits")
    net = _parse_network(f, "subnet")
    host_link = parse_link(f.sub("host_link"), DEFAULT_HOST_LINK) if f.has("host_link") \
        else DEFAULT_HOST_LINK
    hosts = []
    for i, hf in enumerate(f.items("hosts", min_len=1)):
        auto = str(net[10 + i]) if 10 + i < net.num_addresses - 1 else str(net[2])
        hosts.append(_parse_host(hf, name, net, auto, host_link))
    f.done()
    return DatacenterSpec(name, str(net), str(net[1]), host_link, tuple(hosts))


def _parse_wan(f: Fields) -> WanSpec:
    net = _parse_network(f, "subnet")
    a_to_b = parse_link(f.sub("link"))
    b_to_a = parse_link(f.sub("reverse"), a_to_b) if f.has("reverse") else a_to_b
    f.done()
    return WanSpec(str(net), a_to_b, b_to_a)


def _check_unique(f: Fields, dcs: list[DatacenterSpec], wan: WanSpec) -> None:
    nets = [(f"datacenters[{i}].subnet", ipaddress.ip_network(d.subnet))
            for i, d in enumerate(dcs)] + [("wan.subnet", ipaddress.ip_network(wan.subnet))]
    for i, (pa, na) in enumerate(nets):
        for pb, nb in nets[i + 1:]:
            if na.overlaps(nb):
                raise SpecError(f.file, pb, f"a subnet not overlapping {pa} ({na})", str(nb))
    names: dict[str, str] = {}
    ips: dict[str, str] = {}
    reserved = set(RESERVED_NAMES) | {gateway_name(d.name) for d in dcs}
    for i, dc in enumerate(dcs):
        for j, h in enumerate(dc.hosts):
            where = f"datacenters[{i}].hosts[{j}]"
            if h.name in names or h.name in reserved:
                raise SpecError(f.file, where + ".name", "a host name not used elsewhere "
                                "(reserved: wan, gw<dc>)", h.name)
            names[h.name] = where
            if h.ip in ips:
                raise SpecError(f.file, where + ".ip", f"an address not used by {ips[h.ip]}", h.ip)
            ips[h.ip] = where


def _check_roles(file: str, dcs: list[DatacenterSpec]) -> None:
    def dcs_with(role: Role) -> set[str]:
        return {h.dc for dc in dcs for h in dc.hosts if role in h.roles}

    p, md, rld = dcs_with(Role.PREFILL), dcs_with(Role.MAIN_DECODE), dcs_with(Role.RELAY_DECODE)
    if len(p) != 1:
        raise SpecError(file, "datacenters", "prefill hosts in exactly one datacenter", sorted(p))
    if md and md & p:
        raise SpecError(file, "datacenters", "main_decode hosts only in the datacenter "
                        "without prefill (decode runs across the WAN)", sorted(md))
    if rld - p:
        raise SpecError(file, "datacenters", "relay_decode hosts next to prefill "
                        f"(datacenter {sorted(p)[0]})", sorted(rld))


def parse_topology(data: object, file: str) -> Topology:
    f = Fields(data, file, "")
    name = f.str("name")
    description = f.str("description", "")
    dcs = [_parse_dc(d) for d in f.items("datacenters", min_len=MAX_DATACENTERS)]
    if len(dcs) != MAX_DATACENTERS:
        raise f.error("datacenters", "exactly two datacenters", len(dcs))
    if dcs[0].name == dcs[1].name:
        raise SpecError(file, "datacenters[1].name", "a name other than datacenters[0]'s", dcs[1].name)
    wan = _parse_wan(f.sub("wan"))
    f.done()
    _check_unique(f, dcs, wan)
    _check_roles(file, dcs)
    return Topology(name, file, description, (dcs[0], dcs[1]), wan)


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file; raises SpecError on any problem."""
    return parse_topology(load_yaml(path), str(path))
