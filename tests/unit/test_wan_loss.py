"""The router's measure of WAN loss (testbed/pdd/roles/wan_loss.py) and the TCP_INFO
counters it is fed from (testbed/pdd/wire/transport.py)."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from testbed.pdd.roles.wan_loss import LossMeter
from testbed.pdd.wire.transport import TCP_INFO_BYTES, parse_tcp_info


def test_the_share_is_retransmitted_over_sent_in_the_window():
    m = LossMeter(window_s=5.0, min_segments=200)
    m.add(0.0, 1000, 100)
    m.add(1.0, 1000, 0)
    assert m.share(1.0) == pytest.approx(0.05)
    assert m.counts(1.0) == (2000, 100)
    # the first sample leaves the window 5 s after it came
    assert m.share(5.5) == pytest.approx(0.0)
    assert m.counts(5.5) == (1000, 0)
    assert m.counts(6.5) == (0, 0)


def test_too_few_segments_measure_no_share():
    m = LossMeter(window_s=5.0, min_segments=200)
    m.add(0.0, 20, 5)  # a few control frames, one of them retransmitted
    assert m.share(0.0) == 0.0
    m.add(0.1, 180, 5)
    assert m.share(0.1) == pytest.approx(10 / 200)


@pytest.mark.parametrize("args", [(5.0, 0), (0.0, 10)])
def test_a_meter_needs_a_window_and_a_minimum(args):
    with pytest.raises(ValueError):
        LossMeter(*args)


def test_negative_counts_are_refused():
    with pytest.raises(ValueError, match="segment counts"):
        LossMeter(5.0, 1).add(0.0, -1, 0)


def test_tcp_info_is_parsed_at_the_kernels_offsets():
    buf = bytearray(TCP_INFO_BYTES + 40)  # newer kernels return more: the rest is ignored
    struct.pack_into("I", buf, 8, 412000)
    struct.pack_into("I", buf, 100, 31)
    struct.pack_into("I", buf, 136, 4000)
    c = parse_tcp_info(bytes(buf))
    assert (c.segs_out, c.total_retrans, c.rto_s) == (4000, 31, pytest.approx(0.412))
    with pytest.raises(ValueError, match="TCP_INFO of 100 bytes"):
        parse_tcp_info(bytes(100))


def test_a_real_socket_counts_the_segments_it_sent():
    """Loopback TCP: the kernel's counters as parse_tcp_info reads them. 5 MB in segments
    of at most 64 KiB are at least 77 segments. Loopback loses nothing, but a loaded machine
    can make the sender's tail-loss probe or RTO fire spuriously (CI saw 2 of 91), so the
    retransmissions are bounded, not zero: a parse at a wrong offset reads neither."""
    srv = socket.create_server(("127.0.0.1", 0))
    got = []

    def drain():
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(1 << 20):
                got.append(len(data))

    t = threading.Thread(target=drain)
    t.start()
    with socket.create_connection(srv.getsockname()) as s:
        s.sendall(b"x" * 5_000_000)
        s.shutdown(socket.SHUT_WR)  # the receiver's loop ends once it has every byte
        t.join(10)
        c = parse_tcp_info(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES))
    srv.close()
    assert sum(got) == 5_000_000
    assert c.segs_out >= 5_000_000 // 65536
    assert 0 <= c.total_retrans <= c.segs_out // 10
    assert 0.2 <= c.rto_s <= 120.0  # Linux's TCP_RTO_MIN and TCP_RTO_MAX
