"""Parsing of ping and iperf3 output, and the tolerance judgement."""

from __future__ import annotations

import json

import pytest

from testbed.errors import EmulationError
from testbed.net.calibrate import (GOODPUT_SHARE, Check, attempts_until, loss_check, parse_iperf,
                                    parse_ping, parse_udp_in_errors)

PING = """PING 10.77.2.10 (10.77.2.10) 56(84) bytes of data.

--- 10.77.2.10 ping statistics ---
100 packets transmitted, 99 received, 1% packet loss, time 1985ms
rtt min/avg/max/mdev = 40.128/40.757/43.901/0.512 ms
"""


def test_parse_ping():
    p = parse_ping(PING)
    assert p == {"min_ms": 40.128, "avg_ms": 40.757, "max_ms": 43.901, "mdev_ms": 0.512,
                 "sent": 100, "received": 99}


def test_parse_ping_without_replies_is_an_error():
    with pytest.raises(EmulationError, match="cannot parse ping"):
        parse_ping("3 packets transmitted, 0 received, 100% packet loss\n")


def _iperf(protocol, end):
    return json.dumps({"start": {"test_start": {"protocol": protocol}}, "end": end})


def test_parse_iperf_tcp_and_udp():
    tcp = parse_iperf(_iperf("TCP", {"sum_received": {"bits_per_second": 9.5e8},
                                     "sum_sent": {"retransmits": 3}}))
    assert tcp == {"bps": 9.5e8, "retransmits": 3}
    udp = parse_iperf(_iperf("UDP", {"sum_received": {"bits_per_second": 5e7, "lost_percent": 1.1,
                                                      "packets": 10000, "lost_packets": 110},
                                     "sum": {"bits_per_second": 1, "lost_percent": 9,
                                             "packets": 1, "lost_packets": 0},
                                     "sum_sent": {"bits_per_second": 6e7}}))
    assert udp["lost_pct"] == 1.1 and udp["packets"] == 10000  # the receiver's view wins
    assert udp["sent_bps"] == 6e7
    doc = json.loads(_iperf("UDP", {"sum": {"bits_per_second": 1, "lost_percent": 0,
                                            "packets": 1, "lost_packets": 0}}))
    doc["intervals"] = [{"sum": {"bits_per_second": b, "omitted": o}}
                        for b, o in ((5.0, True), (7.0, False), (9.0, False))]
    assert parse_iperf(json.dumps(doc))["interval_bps"] == [7.0, 9.0]  # omitted seconds left out
    with pytest.raises(EmulationError, match="iperf3: busy"):
        parse_iperf(json.dumps({"error": "busy"}))
    with pytest.raises(EmulationError, match="no JSON"):
        parse_iperf("iperf3: error")


def test_check_judges_against_absolute_tolerance():
    assert Check("rtt_ms", 40, 41.9, "ms", 2).judge().passed
    assert not Check("rtt_ms", 40, 42.1, "ms", 2).judge().passed
    assert Check("x", 1, None, "", 1).judge().passed is None
    assert 0.956 < GOODPUT_SHARE < 0.957


def test_a_rate_below_its_floor_is_measured_again_up_to_the_attempts():
    figures = iter([80.0, 97.0, 99.0])
    assert attempts_until(lambda: next(figures), 90.0, 3) == [80.0, 97.0]  # stops once reached
    figures = iter([80.0, 81.0, 82.0, 99.0])
    assert attempts_until(lambda: next(figures), 90.0, 3) == [80.0, 81.0, 82.0]  # gives up
    figures = iter([120.0, 95.0])
    assert attempts_until(lambda: next(figures), 90.0, 3) == [120.0]  # too high is not retried
    assert attempts_until(lambda: 50.0, 90.0, 1) == [50.0]


SNMP = """Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 100
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 5000 2 37 10 37 0 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 0 0 0 0 0
"""


def test_udp_in_errors_are_read_from_the_udp_lines_not_udplite():
    assert parse_udp_in_errors(SNMP) == 37
    with pytest.raises(EmulationError, match="InErrors"):
        parse_udp_in_errors("Ip: Forwarding\nIp: 1\n")


def test_loss_leaves_out_what_the_receivers_socket_dropped():
    udp = {"packets": 6000, "lost": 420}  # 7 % lost, 360 of them in the receiver's socket
    check = loss_check("loss_rev_pct", 1.0, udp, receiver_drops=360)
    assert check.measured == pytest.approx(1.0) and check.passed
    assert "360 of them dropped by the receiver's socket" in check.note
    plain = loss_check("loss_fwd_pct", 1.0, udp, receiver_drops=0)
    assert plain.measured == pytest.approx(7.0) and plain.passed is False and not plain.note
    # drops elsewhere on the host (another socket) cannot make the link better than lossless
    assert loss_check("x", 0.0, {"packets": 100, "lost": 1}, 50).measured == 0.0
    assert loss_check("x", 1.0, {"packets": 0, "lost": 0}, 0).passed is None
