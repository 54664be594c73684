"""``testbed shell``: Mininet's CLI on a live emulated network.

Owns a thin view that gives Mininet's CLI what it reads of a Mininet object
(hosts by name) without Mininet building anything: the network is ours, so
``help``, ``nodes``, ``<host> cmd...``, ``py net...`` work and leaving the
CLI tears the network down through the usual registry.
"""

from __future__ import annotations


class MininetView:
    """The subset of mininet.net.Mininet that mininet.cli.CLI uses."""

    def __init__(self, net):
        self.net = net
        self.hosts = [n for n in net.nodes.values() if n is not None]
        self.switches: list = []
        self.controllers: list = []
        self.links: list = []
        self.nameToNode = {h.name: h for h in self.hosts}

    def __getitem__(self, key):
        return self.nameToNode[key]

    def __contains__(self, key):
        return key in self.nameToNode

    def __iter__(self):
        return iter(self.nameToNode)

    def get(self, *names):
        nodes = [self.nameToNode[n] for n in names]
        return nodes[0] if len(nodes) == 1 else nodes

    def keys(self):
        return list(self.nameToNode)

    def values(self):
        return list(self.nameToNode.values())

    def items(self):
        return list(self.nameToNode.items())


def run_shell(net) -> None:
    from mininet.cli import CLI
    from mininet.log import setLogLevel

    setLogLevel("info")
    print(f"testbed: network {net.plan.prefix} up ({net.plan.backend.value}, k={net.plan.scale:g}). "
          "Hosts: " + " ".join(sorted(k for k, v in net.nodes.items() if v is not None)))
    CLI(MininetView(net))
