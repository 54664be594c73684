"""Offline pcap analysis on a synthetic capture written with scapy."""

from __future__ import annotations

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import PcapWriter

from testbed.pdd.wire.protocol import HEADER_SIZE, Frame, Handoff, KvChunk, encode_frame
from testbed.report.pcap import PcapError, analyse_pcap, crosscheck

P, MD, X1, X2 = "10.0.1.2", "10.0.2.2", "10.0.1.3", "10.0.2.3"
SNAP = 256  # the capture keeps 256 bytes of each packet (tcpdump -s 256)


class Capture:
    """Packets with their times; each written cut at SNAP bytes like tcpdump -s."""

    def __init__(self, path):
        self.w = PcapWriter(str(path), linktype=1, snaplen=SNAP)

    def add(self, t: float, pkt) -> int:
        raw = bytes(pkt)
        cut = Ether(raw[:SNAP])  # what the capture keeps; the IP header still says the length
        cut.time, cut.wirelen = t, len(raw)
        self.w.write(cut)
        return len(pkt[IP])

    def close(self):
        self.w.close()


def tcp(src, dst, sport, dport, seq, ack, flags, payload=b""):
    pkt = Ether() / IP(src=src, dst=dst) / TCP(sport=sport, dport=dport, seq=seq, ack=ack,
                                                 flags=flags)
    return pkt / Raw(payload) if payload else pkt


def handoff_frame(n_tokens: int) -> bytes:
    return encode_frame(Frame(5, Handoff(0, 1, tuple(range(n_tokens)), True)))


def kv_frame_head() -> bytes:
    """The first 1000 bytes of a KV_CHUNK that announces 100 kB of filler (KV)."""
    whole = encode_frame(Frame(5, KvChunk(0, 4, 0, 64, b"\x01" * 1000, filler=100_000)))
    return whole[:1000]


@pytest.fixture
def capture(tmp_path):
    path = tmp_path / "wan.pcap"
    cap = Capture(path)
    wire = {"p>md": 0, "md>p": 0, "cross": 0}
    isn_p, isn_md = 1000, 5000
    wire["p>md"] += cap.add(0.000, tcp(P, MD, 40000, 7103, isn_p, 0, "S"))
    wire["md>p"] += cap.add(0.040, tcp(MD, P, 7103, 40000, isn_md, isn_p + 1, "SA"))
    h = handoff_frame(100)
    two = handoff_frame(3) + handoff_frame(100)  # two frames in one segment, the second
    # one's header within the snap, its token ids beyond it
    kv = kv_frame_head()
    seq = isn_p + 1
    segs = [(0.10, h), (0.20, kv), (0.30, two)]
    sent = []
    for t, payload in segs:
        wire["p>md"] += cap.add(t, tcp(P, MD, 40000, 7103, seq, isn_md + 1, "PA", payload))
        sent.append((t, seq + len(payload)))
        seq += len(payload)
    # MD acks each segment 40 ms later, except the first: lost, so P resends it at 0.5 s
    for (t, end) in sent[1:]:
        wire["md>p"] += cap.add(t + 0.040, tcp(MD, P, 7103, 40000, isn_md + 1, end, "A"))
    wire["p>md"] += cap.add(0.500, tcp(P, MD, 40000, 7103, isn_p + 1, isn_md + 1, "PA", h))
    wire["md>p"] += cap.add(0.540, tcp(MD, P, 7103, 40000, isn_md + 1, seq, "A"))
    # cross traffic: iperf3-like UDP on port 5301, 3 x 1000-byte datagrams
    for i in range(3):
        wire["cross"] += cap.add(0.1 * i, Ether() / IP(src=X1, dst=X2) /
                                 UDP(sport=5301, dport=5301) / Raw(b"\0" * 972))
    cap.close()
    return path, wire, len(h), len(handoff_frame(3))


def test_bytes_per_flow_and_path_count_the_wire_not_the_snap(capture):
    path, wire, _, _ = capture
    a = analyse_pcap(path, names={P: "p1", MD: "md1"})
    assert a.paths[("p1", "md1")]["bytes"] == wire["p>md"]
    assert a.paths[("md1", "p1")]["bytes"] == wire["md>p"]
    assert a.paths[(X1, X2)]["bytes"] == wire["cross"] == 3 * 1000
    flow = a.flows[(P, 40000, MD, 7103, "tcp")]
    assert flow.packets == 5
    # payload on the wire: handoff frame twice, the KV head, the two-frame segment
    assert flow.payload_bytes == 3 * len(handoff_frame(100)) + 1000 + len(handoff_frame(3))


def test_retransmission_and_rtt_samples(capture):
    path, _, _, _ = capture
    a = analyse_pcap(path)
    flow = a.flows[(P, 40000, MD, 7103, "tcp")]
    assert flow.retransmits == 1 and a.retransmits == 1
    # the KV segment's and the two-frame segment's ACKs, 40 ms each; the final ACK
    # covers only the resent segment, which Karn's rule excludes
    assert flow.rtt_ms == pytest.approx([40.0, 40.0], abs=0.01)
    # the handshake: MD's SYN-ACK has no data, so MD's direction gives no sample
    assert a.flows[(MD, 7103, P, 40000, "tcp")].rtt_ms == []


def test_cross_traffic_share(capture):
    path, wire, _, _ = capture
    a = analyse_pcap(path)
    assert a.cross_bytes == wire["cross"]
    assert a.cross_share == pytest.approx(wire["cross"] / sum(wire.values()))
    assert analyse_pcap(path, cross_ports=()).cross_share == 0.0


def test_handoff_frames_carry_token_ids_only(capture):
    path, _, h_size, h3_size = capture
    a = analyse_pcap(path)
    # the first HANDOFF, its retransmission, and two in one segment
    assert sorted(a.frames["HANDOFF"]) == sorted([h_size, h_size, h_size, h3_size])
    assert h_size == HEADER_SIZE + 9 + 4 * 100
    assert sorted(a.handoff_tokens) == [3, 100, 100, 100]
    assert a.handoff_with_filler == 0
    # a KV_CHUNK's size is what its header announces, filler (the modeled KV) included,
    # though the capture holds 256 bytes of it
    whole = len(encode_frame(Frame(5, KvChunk(0, 4, 0, 64, b"\x01" * 1000, filler=100_000))))
    assert a.frames["KV_CHUNK"] == [whole] and whole > 100_000


def test_crosscheck_ratios():
    got = crosscheck(roles_bytes=900, link_bytes=1100, packet_bytes=1000)
    assert got["roles_over_packets"] == pytest.approx(0.9)
    assert got["link_over_packets"] == pytest.approx(1.1)
    assert crosscheck(1, 1, 0)["link_over_packets"] is None


def test_unreadable_capture(tmp_path):
    with pytest.raises(PcapError, match="no such capture"):
        analyse_pcap(tmp_path / "none.pcap")
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"not a pcap at all")
    with pytest.raises(PcapError, match="cannot read"):
        analyse_pcap(bad)


def test_a_modes_capture_report_sets_the_three_byte_counts_side_by_side(capture):
    """P (10.0.1.0/24, side a) -> MD (10.0.2.0/24): the roles' bytes against the PDD
    flows' packets, the link counter against every a>b packet (cross traffic too)."""
    from testbed.report.pcap import mode_capture_report

    path, wire, _, _ = capture
    subnets = {"a": "10.0.1.0/24", "b": "10.0.2.0/24"}
    c = mode_capture_report(path, subnets, roles_a_to_b=wire["p>md"] // 2,
                            link_a_to_b=wire["p>md"] + wire["cross"])
    ab = c["a_to_b"]
    assert ab["packet_bytes"] == wire["p>md"] and ab["all_packet_bytes"] == wire["p>md"] + \
        wire["cross"]
    assert ab["roles_over_packets"] == pytest.approx(0.5, abs=1e-3)
    assert ab["link_over_all_packets"] == pytest.approx(1.0)
    assert c["handoff_frames"] == 4 and c["handoff_frames_with_filler"] == 0
    assert c["retransmits"] == 1 and c["rtt_samples"] >= 2
    assert c["packets"] == 5 + 4 + 3  # P->MD, MD->P, cross
