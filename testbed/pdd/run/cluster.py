"""A whole PDD cluster inside one event loop: for tests and the scenario runner.

Owns ``ROLE_CLASSES`` (wire Role -> role class), ``start_cluster`` and
``ClusterHandles``. Roles start in dependency order (P, RLD, MD, then the
router, which connects to all of them); the client is not started: run one
with ``handles.run_client(requests)``. ``stop()`` stops every role in
reverse order and is idempotent; ``kill(name)`` stops one role at once (its
connections close: a crash as the others see it).

Example::

    net = wan_network(cfg, LinkSpec(rate_gbit=1000, delay_ms=50))
    handles = await start_cluster(cfg, lambda inst: net.host(inst.host))
    try:
        records = await handles.run_client(requests)
    finally:
        await handles.stop()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from testbed.pdd.roles.client import Client
from testbed.pdd.roles.client_record import ClientRequest
from testbed.pdd.run.config import ClusterConfig, Instance
from testbed.pdd.roles.main_decode import MainDecodeNode
from testbed.pdd.compute.engine import pin_threads
from testbed.pdd.roles.peers import RoleServer
from testbed.pdd.roles.prefill import PrefillNode
from testbed.pdd.roles.relay_decode import RelayDecodeNode
from testbed.pdd.roles.router import RouterNode
from testbed.pdd.wire.transport import Transport
from testbed.pdd.wire.fields import Role

ROLE_CLASSES: dict[Role, type[RoleServer]] = {
    Role.PREFILL: PrefillNode,
    Role.RELAY_DECODE: RelayDecodeNode,
    Role.MAIN_DECODE: MainDecodeNode,
    Role.ROUTER: RouterNode,
}
START_ORDER = (Role.PREFILL, Role.RELAY_DECODE, Role.MAIN_DECODE, Role.ROUTER)

TransportFactory = Callable[[Instance], Transport]


@dataclass
class ClusterHandles:
    """The running roles of one in-process cluster, by instance name."""

    cfg: ClusterConfig
    transport_factory: TransportFactory
    roles: dict[str, RoleServer] = field(default_factory=dict)

    def role(self, name: str) -> RoleServer:
        return self.roles[name]

    async def run_client(self, requests: Sequence[ClientRequest],
                         name: str | None = None) -> list[dict]:
        """Replay ``requests`` from a client instance (the first one if unnamed)."""
        clients = self.cfg.of_role(Role.CLIENT)
        inst = self.cfg.instance(name) if name else (clients[0] if clients else None)
        transport = self.transport_factory(inst or Instance("client", Role.CLIENT))
        return await Client(self.cfg, transport, inst.name if inst else "client").run(requests)

    async def kill(self, name: str) -> None:
        """Stop one role now (its peers see its connections close)."""
        await self.roles.pop(name).stop()

    async def restart(self, name: str) -> None:
        """Start a fresh process-equivalent of instance ``name`` (after ``kill``): empty
        caches, same address."""
        inst = self.cfg.instance(name)
        node = ROLE_CLASSES[inst.role](self.cfg, name, self.transport_factory(inst))
        await node.start()
        self.roles[name] = node

    async def stop(self) -> None:
        for name in reversed(list(self.roles)):
            await self.roles.pop(name).stop()


async def start_cluster(cfg: ClusterConfig, transport_factory: TransportFactory) -> ClusterHandles:
    """Start every P, RLD, MD and router instance of ``cfg``; see the module docstring."""
    pin_threads(cfg.model, 1)  # roles share the loop: one torch thread avoids 2-core contention
    handles = ClusterHandles(cfg, transport_factory)
    try:
        for role in START_ORDER:
            for inst in cfg.of_role(role):
                node = ROLE_CLASSES[role](cfg, inst.name, transport_factory(inst))
                await node.start()
                handles.roles[inst.name] = node
    except BaseException:
        await handles.stop()
        raise
    return handles
