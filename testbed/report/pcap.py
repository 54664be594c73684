"""Offline analysis of a (bounded, sampled) WAN packet capture, with scapy.

Owns FlowStats, PcapAnalysis, ``analyse_pcap`` and ``crosscheck``. Pure over
one pcap file: it reads the file and nothing else (no network, no run
directory), so a capture can be analysed on any machine.

What it computes, per TCP/UDP flow (5-tuple, one direction each):
- packets and bytes, from the IP header's total length, so a capture cut
  at a snap length still counts what crossed the wire;
- TCP retransmissions: data segments whose sequence range ends at or before
  the highest sequence already seen in that direction;
- RTT samples: a data segment's first transmission to the first ACK from
  the other side that covers its end (Karn's rule: retransmitted segments
  give no sample), in ms; both directions must be in the capture (the WAN
  node sees both);
- PDD frames found in the captured payload: a frame header at the start of
  a segment (or right after a whole frame in the same segment) whose magic,
  version and header CRC check out (testbed.pdd.wire.protocol.parse_header), by
  message type with each frame's size on the wire; a HANDOFF frame's token
  count is (payload - 9) / 4, and it must carry no filler (no KV).
Per path (source -> destination address, or the names given): bytes,
packets and retransmissions; and cross traffic's share of all bytes
(flows with a port in ``cross_ports``; the testbed's iperf3 cross flows
use ports from 5300, testbed/net/crosstraffic.py).

The capture comes from ``--pcap`` (testbed/scenario/capture.py: tcpdump on
the WAN channel's device, 128-byte snap, at most 200k packets);
``mode_capture_report`` turns one mode's file into MODE/pcap.json and the
report's "WAN packets" table, the roles' bytes, the link counter and the
packets side by side.

Example::

    a = analyse_pcap("runs/x/pdd/wan.pcap", names={"10.0.1.2": "p1", "10.0.2.2": "md1"})
    a.paths[("p1", "md1")]["bytes"], a.cross_share, a.frames["HANDOFF"]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from testbed.errors import ProtocolError, TestbedError
from testbed.pdd.wire.protocol import HEADER_SIZE, MsgType, parse_header

CROSS_PORTS = range(5300, 5400)  # iperf3 cross traffic (testbed/net/crosstraffic.py)
HANDOFF_FIXED = 9  # HANDOFF payload: batch u32, start u32, final u8, then u32 token ids
SEQ_MOD = 1 << 32

FlowKey = tuple[str, int, str, int, str]  # src, sport, dst, dport, proto


class PcapError(TestbedError):
    """The capture cannot be read."""


@dataclass
class FlowStats:
    packets: int = 0
    bytes: int = 0           # IP total length
    payload_bytes: int = 0   # transport payload on the wire
    retransmits: int = 0
    rtt_ms: list[float] = field(default_factory=list)
    t_first: float | None = None
    t_last: float | None = None
    cross: bool = False


@dataclass
class PcapAnalysis:
    flows: dict[FlowKey, FlowStats]
    paths: dict[tuple[str, str], dict]
    frames: dict[str, list[int]]            # message type -> frame sizes on the wire
    handoff_tokens: list[int]               # token ids per HANDOFF frame
    handoff_with_filler: int                # HANDOFF frames that carried filler (must be 0)
    total_bytes: int
    cross_bytes: int

    @property
    def cross_share(self) -> float | None:
        return self.cross_bytes / self.total_bytes if self.total_bytes else None

    @property
    def retransmits(self) -> int:
        return sum(f.retransmits for f in self.flows.values())


@dataclass
class _Dir:
    """One direction of a TCP connection: what has been sent, what waits for an ACK."""

    isn: int
    high: int = 0                                   # highest relative seq end seen
    pending: dict[int, float] = field(default_factory=dict)  # seq end -> first send time
    resent: set[int] = field(default_factory=set)


def _frames_in(payload: bytes) -> Iterable[tuple[MsgType, int, int, int]]:
    """(type, payload length, filler, size) of each whole-header frame from offset 0."""
    off = 0
    while len(payload) - off >= HEADER_SIZE:
        try:
            h = parse_header(payload[off:off + HEADER_SIZE])
        except ProtocolError:
            return
        size = HEADER_SIZE + h.payload_len + h.filler_len
        yield h.msg_type, h.payload_len, h.filler_len, size
        off += size


def _read(path: Path):
    from scapy.error import Scapy_Exception
    from scapy.utils import PcapReader

    try:
        with PcapReader(str(path)) as reader:
            yield from reader
    except (OSError, Scapy_Exception) as e:
        raise PcapError(f"{path}: cannot read the capture ({e})") from e


def analyse_pcap(path: str | Path, names: Mapping[str, str] | None = None,
                 cross_ports: Iterable[int] = CROSS_PORTS) -> PcapAnalysis:
    """Flows, paths, retransmissions, RTT samples, cross share and PDD frames of one pcap."""
    from scapy.layers.inet import IP, TCP, UDP

    names, cross = dict(names or {}), set(cross_ports)
    flows: dict[FlowKey, FlowStats] = {}
    dirs: dict[FlowKey, _Dir] = {}
    frames: dict[str, list[int]] = {}
    handoff_tokens: list[int] = []
    with_filler = 0
    path = Path(path)
    if not path.is_file():
        raise PcapError(f"{path}: no such capture")
    for pkt in _read(path):
        ip = pkt.getlayer(IP)
        if ip is None:
            continue
        l4 = ip.getlayer(TCP) or ip.getlayer(UDP)
        proto = "tcp" if isinstance(l4, TCP) else "udp" if l4 is not None else str(ip.proto)
        sport, dport = (int(l4.sport), int(l4.dport)) if l4 is not None else (0, 0)
        key = (ip.src, sport, ip.dst, dport, proto)
        t = float(pkt.time)
        f = flows.setdefault(key, FlowStats(cross=sport in cross or dport in cross))
        f.packets += 1
        f.bytes += int(ip.len)
        f.t_first = t if f.t_first is None else f.t_first
        f.t_last = t
        if not isinstance(l4, TCP):
            continue
        wire_payload = int(ip.len) - int(ip.ihl) * 4 - int(l4.dataofs) * 4
        f.payload_bytes += max(0, wire_payload)
        _tcp(dirs, flows, key, l4, wire_payload, t)
        captured = bytes(l4.payload)
        for mtype, plen, filler, size in _frames_in(captured):
            frames.setdefault(mtype.name, []).append(size)
            if mtype == MsgType.HANDOFF:
                handoff_tokens.append((plen - HANDOFF_FIXED) // 4)
                with_filler += filler > 0
    paths: dict[tuple[str, str], dict] = {}
    for (src, _, dst, _, _), f in flows.items():
        p = paths.setdefault((names.get(src, src), names.get(dst, dst)),
                             {"bytes": 0, "packets": 0, "retransmits": 0, "cross_bytes": 0})
        p["bytes"] += f.bytes
        p["packets"] += f.packets
        p["retransmits"] += f.retransmits
        p["cross_bytes"] += f.bytes if f.cross else 0
    total = sum(f.bytes for f in flows.values())
    return PcapAnalysis(flows, paths, frames, handoff_tokens, with_filler, total,
                        sum(f.bytes for f in flows.values() if f.cross))


def _tcp(dirs: dict[FlowKey, _Dir], flows: dict[FlowKey, FlowStats], key: FlowKey, tcp,
         n_payload: int, t: float) -> None:
    """Retransmissions of this direction; the RTT samples its ACK gives the other one."""
    seq, flags = int(tcp.seq), int(tcp.flags)
    d = dirs.get(key)
    if d is None:
        d = dirs[key] = _Dir(isn=(seq + 1) % SEQ_MOD if flags & 0x02 else seq)
    if n_payload > 0:
        end = (seq - d.isn) % SEQ_MOD + n_payload
        if end <= d.high:
            flows[key].retransmits += 1
            d.resent.add(end)
            d.pending.pop(end, None)
        else:
            d.pending[end] = t
            d.high = end
    rkey = (key[2], key[3], key[0], key[1], key[4])
    rev = dirs.get(rkey)
    if not flags & 0x10 or rev is None:  # not an ACK, or the data's direction unseen
        return
    ack = (int(tcp.ack) - rev.isn) % SEQ_MOD
    covered = [e for e in rev.pending if e <= ack]
    if covered:
        newest = max(covered)
        if newest not in rev.resent:  # Karn: no sample from a retransmitted segment
            flows[rkey].rtt_ms.append((t - rev.pending[newest]) * 1000.0)
        for e in covered:
            del rev.pending[e]


def crosscheck(roles_bytes: int, link_bytes: int, packet_bytes: int) -> dict:
    """One path's three byte counts side by side: what the roles say they sent
    (requests.jsonl), the shaper's counter (links.csv) and the packets (the
    capture), with each as a ratio to the packets (None when no packet)."""
    def ratio(x: int) -> float | None:
        return x / packet_bytes if packet_bytes else None

    return {"roles_bytes": roles_bytes, "link_bytes": link_bytes, "packet_bytes": packet_bytes,
            "roles_over_packets": ratio(roles_bytes), "link_over_packets": ratio(link_bytes)}


def _dc_of(addr: str, subnets: Mapping[str, str]) -> str | None:
    import ipaddress

    ip = ipaddress.ip_address(addr)
    return next((dc for dc, net in subnets.items() if ip in ipaddress.ip_network(net)), None)


def mode_capture_report(pcap_path: str | Path, subnets: Mapping[str, str], roles_a_to_b: int,
                        link_a_to_b: int | None) -> dict:
    """One mode's capture (``MODE/wan.pcap``) as plain data for ``MODE/pcap.json`` and the
    report: packets, bytes, cross traffic's share, retransmissions, RTT samples of the a>b
    data (the capture is at side a's end of the WAN), the PDD
    frames seen, and the three byte counts of the a>b direction side by side
    (``crosscheck``: the roles' kv_wan + handoff bytes against the PDD flows' packets, the
    shaper's counter against all a>b packets). ``subnets``: datacenter name -> subnet, the
    first datacenter being side a. Emulated bytes throughout."""
    import statistics

    a = analyse_pcap(pcap_path)
    dcs = list(subnets)
    ab = {"pdd": 0, "all": 0}
    for (src, _, dst, _, _), f in a.flows.items():
        if _dc_of(src, subnets) == dcs[0] and _dc_of(dst, subnets) == dcs[-1]:
            ab["all"] += f.bytes
            ab["pdd"] += 0 if f.cross else f.bytes
    # RTT from a>b data only: the capture sits at side a's end of the WAN, where a>b data
    # waits the whole round trip for its ACK and b>a data is ACKed at once
    rtts = [x for (src, _, dst, _, _), f in a.flows.items() for x in f.rtt_ms
            if _dc_of(src, subnets) == dcs[0] and _dc_of(dst, subnets) == dcs[-1]]
    check = crosscheck(roles_a_to_b, link_a_to_b or 0, ab["pdd"])
    check["link_over_all_packets"] = (link_a_to_b / ab["all"] if ab["all"] and link_a_to_b
                                      is not None else None)
    check["all_packet_bytes"] = ab["all"]
    return {"packets": sum(f.packets for f in a.flows.values()), "bytes": a.total_bytes,
            "cross_share": a.cross_share, "retransmits": a.retransmits,
            "rtt_ms_p50": statistics.median(rtts) if rtts else None, "rtt_samples": len(rtts),
            "frames": {k: len(v) for k, v in sorted(a.frames.items())},
            "handoff_frames": len(a.handoff_tokens),
            "handoff_tokens_per_frame_max": max(a.handoff_tokens, default=None),
            "handoff_frames_with_filler": a.handoff_with_filler,
            "a_to_b": check}
