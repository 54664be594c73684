"""An in-memory network with a shaped WAN: the fake transport plus rate and jitter.

Owns ``LinkShape`` (one direction between two hosts: one-way delay, uniform
jitter, rate), ``ShapedFakeNetwork`` (a ``FakeNetwork`` whose links may be
shaped; one shared serialiser per ordered host pair, so every connection
from P to MD shares the WAN's rate) and ``wan_network`` (two datacenters
from a cluster config: WAN links between instances in different DCs).

Byte timing on a shaped link: a write starts serialising when the link is
free (``busy_until``), takes ``len / rate_bytes_s``, then arrives after
``delay_s + U(-jitter_s, +jitter_s)``; arrival times never decrease on one
connection (TCP delivers in order). Like the plain fake, senders never
block (no flow control, no loss). Builds on ``fake_transport``'s internal
pipe (``_Pipe``), so a change there must keep ``_in_flight`` and
``_run_pump``.

Example::

    net = wan_network(cfg, LinkShape(delay_s=0.05, jitter_s=0.005, rate_bytes_s=20e6))
    handles = await start_cluster(cfg, lambda inst: net.host(inst.host))
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from testbed.pdd.run.config import ClusterConfig
from testbed.pdd.wire.fake_transport import FakeNetwork, FakeTransport, _Pipe


@dataclass(frozen=True)
class LinkShape:
    """One direction of a link between two hosts."""

    delay_s: float = 0.0  # one-way propagation delay
    jitter_s: float = 0.0  # uniform +- jitter on each write's delay (order is kept)
    rate_bytes_s: float | None = None  # serialisation rate; None = unlimited


class _LinkState:
    """The shared serialiser of one shaped direction (all its connections)."""

    def __init__(self, shape: LinkShape, rng: random.Random):
        self.shape, self.rng = shape, rng
        self.busy_until = 0.0
        self.bytes_sent = 0


class _ShapedPipe(_Pipe):
    def __init__(self, link: _LinkState):
        super().__init__(link.shape.delay_s)
        self._link = link
        self._last_at = 0.0

    def put(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        now, shape = loop.time(), self._link.shape
        sent = now
        if data and shape.rate_bytes_s:
            start = max(now, self._link.busy_until)
            self._link.busy_until = sent = start + len(data) / shape.rate_bytes_s
        self._link.bytes_sent += len(data)
        jitter = self._link.rng.uniform(-shape.jitter_s, shape.jitter_s) if shape.jitter_s else 0
        at = max(self._last_at, sent + max(0.0, shape.delay_s + jitter))
        self._last_at = at
        if self._pump is None:
            self._pump = loop.create_task(self._run_pump())
        self._in_flight.put_nowait((at, data))


class ShapedFakeNetwork(FakeNetwork):
    """A FakeNetwork whose host pairs may have a ``LinkShape`` per direction."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self._rng = random.Random(seed)
        self._links: dict[tuple[str, str], _LinkState] = {}

    def shape(self, src: str, dst: str, shape: LinkShape) -> None:
        self._links[(src, dst)] = _LinkState(shape, self._rng)

    def link(self, src: str, dst: str) -> _LinkState:
        if (src, dst) not in self._links:
            self._links[(src, dst)] = _LinkState(LinkShape(self.delay_s(src, dst)), self._rng)
        return self._links[(src, dst)]

    def bytes_sent(self, src: str, dst: str) -> int:
        return self.link(src, dst).bytes_sent

    def host(self, name: str) -> FakeTransport:
        return ShapedFakeTransport(self, name)


class ShapedFakeTransport(FakeTransport):
    """Host ``name``'s view of a ShapedFakeNetwork (same API as FakeTransport)."""

    network: ShapedFakeNetwork

    def _pipes(self, host: str) -> tuple[float, object, object]:
        out_link, back_link = self.network.link(self.name, host), self.network.link(host, self.name)
        return (out_link.shape.delay_s + back_link.shape.delay_s, _ShapedPipe(out_link),
                _ShapedPipe(back_link))


def wan_network(cfg: ClusterConfig, wan: LinkShape, intra: LinkShape = LinkShape(),
                seed: int = 0) -> ShapedFakeNetwork:
    """A network where each instance is a host named by ``inst.host``; hosts in
    different DCs are joined by ``wan`` (both directions), the rest by ``intra``."""
    net = ShapedFakeNetwork(seed)
    for a in cfg.instances:
        for b in cfg.instances:
            if a.host != b.host:
                net.shape(a.host, b.host, wan if a.dc != b.dc else intra)
    return net
