"""The shared unit arithmetic and how each caller rounds it."""

from __future__ import annotations

from types import SimpleNamespace

from testbed.export.build import wan_bdp_bytes
from testbed.linkmath import MTU_BYTES, bdp_bytes
from testbed.net.shaping import in_flight_pkts, queue_limit_pkts


def test_bdp_is_rate_times_time_in_bytes_unrounded():
    assert bdp_bytes(10e9, 40) == 50_000_000
    assert bdp_bytes(1e6, 0.012) == 1.5  # 1 Mbit/s for 12 us


def test_the_planner_counts_whole_bytes_in_mtu_packets():
    # 1 Gbit/s x 24 ms = 3_000_000 bytes = 2000 MTU packets; the spec's limit wins
    assert queue_limit_pkts(1_000_000_000, 24, None) == 2000
    assert queue_limit_pkts(1_000_000_000, 24, 7) == 7
    assert queue_limit_pkts(1_000_000, 1, None) == 64  # at least 64
    # 1 Gbit/s held 20 + 3 x 0 ms: 2_500_000 bytes, x 1.25 in MTU packets
    assert in_flight_pkts(1_000_000_000, 20, 0) == 2084
    assert in_flight_pkts(1_000_000, 1, 0) == 16  # at least 16


def _wan(rate_gbit: float, one_way_ms: float, reverse_gbit: float | None = None):
    a = SimpleNamespace(rate_gbit=rate_gbit)
    b = SimpleNamespace(rate_gbit=rate_gbit if reverse_gbit is None else reverse_gbit)
    return SimpleNamespace(a_to_b=a, b_to_a=b, rtt_ms=2 * one_way_ms)


def test_the_export_rounds_the_wan_bdp_and_keeps_one_mtu():
    assert wan_bdp_bytes(_wan(10, 20)) == 50_000_000  # 10 Gbit/s x 40 ms
    assert wan_bdp_bytes(_wan(1, 20, reverse_gbit=10)) == 50_000_000  # the faster direction
    assert wan_bdp_bytes(_wan(0.001, 0.05)) == MTU_BYTES
