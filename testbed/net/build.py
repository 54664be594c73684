"""From a topology to a live network in one call: probe, scale, plan, apply.

Owns the choice of backend (probe, or the user's) and of the bandwidth
scale k (the user's, or the smallest that fits the backend's capacity, see
shaping.choose_scale). Returns an EmulatedNetwork ready to enter.

Example::

    with open_network(load_topology("topologies/two-dc.yaml")) as net:
        ...
"""

from __future__ import annotations

from testbed.net import naming
from testbed.net.apply import EmulatedNetwork
from testbed.net.backend import probe_backend
from testbed.net.events import EventLog
from testbed.net.plan import NetworkPlan, plan_network
from testbed.net.shaping import Backend, choose_scale
from testbed.spec.topology import Topology


def auto_scale(topo: Topology, backend: Backend) -> float:
    wan = max(topo.wan.a_to_b.rate_gbit, topo.wan.b_to_a.rate_gbit)
    intra = max(h.link.rate_gbit for h in topo.hosts)
    intra = max([intra] + [dc.host_link.rate_gbit for dc in topo.datacenters])
    return choose_scale(wan, intra, backend)


def make_plan(topo: Topology, backend: Backend, scale: float | None = None,
              seed: int = 1, prefix: str | None = None) -> NetworkPlan:
    k = scale if scale is not None else auto_scale(topo, backend)
    return plan_network(topo, prefix or naming.new_run_prefix(), backend, k, seed)


def open_network(topo: Topology, backend: Backend | None = None, scale: float | None = None,
                 seed: int = 1, events: EventLog | None = None) -> EmulatedNetwork:
    """Probe the kernel (``backend`` forces one), plan, and return the network
    (built when entered as a context manager)."""
    chosen, _ = probe_backend(backend)
    return EmulatedNetwork(make_plan(topo, chosen, scale, seed), events)
