"""TCP cross traffic over the WAN: N iperf3 flows between cross-traffic hosts.

Owns the iperf3 processes of one congestion episode: a server in the
receiving datacenter's cross-traffic host and one client with ``-P N``
parallel TCP streams in the sending one. ``start_cross_traffic`` returns a
handle; ``stop()`` ends both by pid and logs the event. All processes are
registered with the network's registry, so teardown and ``testbed clean``
remove them too.

Example::

    flows = start_cross_traffic(net, n_flows=4)   # a>b, until stopped
    ...
    flows.stop()
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from testbed.errors import EmulationError
from testbed.net.apply import wait_listening
from testbed.net.registry import stop_process
from testbed.spec.topology import Role

BASE_PORT = 5300
_ports = itertools.count(BASE_PORT)


@dataclass
class CrossTraffic:
    net: object
    n_flows: int
    direction: str
    procs: list
    port: int

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                stop_process(p.pid, None, timeout_s=2.0)
        self.net.events.record("cross_traffic_stop", n_flows=self.n_flows,
                               direction=self.direction, port=self.port)


def _endpoints(net, direction: str) -> tuple[str, str]:
    a, b = net.plan.topology.datacenters
    xa = [h.name for h in a.hosts if Role.CROSS_TRAFFIC in h.roles]
    xb = [h.name for h in b.hosts if Role.CROSS_TRAFFIC in h.roles]
    if not xa or not xb:
        raise EmulationError("cross traffic needs a cross_traffic host in each datacenter")
    return (xa[0], xb[0]) if direction == "a>b" else (xb[0], xa[0])


def start_cross_traffic(net, n_flows: int, direction: str = "a>b",
                        duration_s: float = 86400) -> CrossTraffic:
    """Start ``n_flows`` TCP flows across the WAN in ``direction``."""
    if n_flows < 1:
        raise EmulationError(f"n_flows must be >= 1, got {n_flows}")
    src, dst = _endpoints(net, direction)
    port = next(_ports)
    server = net.popen(dst, ["iperf3", "-s", "-1", "-p", str(port)], what="iperf3 server")
    wait_listening(net, dst, port)
    client = net.popen(src, ["iperf3", "-c", net.ip(dst), "-p", str(port), "-P", str(n_flows),
                             "-t", str(int(duration_s)), "-i", "0"], what="iperf3 client")
    net.events.record("cross_traffic_start", n_flows=n_flows, direction=direction,
                      src=src, dst=dst, port=port)
    return CrossTraffic(net, n_flows, direction, [server, client], port)
