"""A link's unit arithmetic: packet sizes and the bandwidth-delay product.

Owns the numbers the network planner (testbed/net/shaping.py) and the
Kubernetes export (testbed/export/build.py) both size queues with. Units are
in the names; nothing here rounds: each caller rounds as its output needs
(the planner truncates to whole bytes, the export rounds and keeps at least
one MTU). Pure, imports nothing of the testbed.

Example::

    bdp_bytes(10e9, 40.0)    # 50_000_000.0 bytes: 10 Gbit/s x 40 ms
"""

from __future__ import annotations

MTU_BYTES = 1500      # an Ethernet frame's payload, the packet size queues are counted in
GSO_MAX_BYTES = 65536  # the largest GSO/TSO packet a qdisc sees


def bdp_bytes(rate_bps: float, rtt_ms: float) -> float:
    """Bandwidth-delay product, unrounded: ``rate_bps`` bits per second for ``rtt_ms``
    milliseconds, in bytes."""
    return rate_bps / 8 * rtt_ms / 1e3
