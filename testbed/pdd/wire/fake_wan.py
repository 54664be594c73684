"""An in-memory network with a shaped WAN: the fake transport plus rate and jitter.

Owns ``ShapedFakeNetwork`` (a ``FakeNetwork`` whose links may be shaped by a
``LinkSpec``, testbed/impairment.py's one link type; one shared serialiser
per ordered host pair, so every connection from P to MD shares the WAN's
rate) and ``wan_network`` (two datacenters from a cluster config: WAN links
between instances in different DCs).

What a shaped direction emulates of its ``LinkSpec``: ``delay_ms`` (one
way), ``jitter_ms`` with ``jitter_distribution`` 'uniform' (+-jitter_ms) or
'normal' (a gauss draw, sigma jitter_ms), and ``rate_gbit`` as the
serialisation rate (pass a high rate, e.g. 1000, for "unlimited").
``queue_limit_pkts`` is ignored (senders never block). What a reliable
in-process byte stream cannot emulate is refused with a ValueError naming
the field and its value: loss (``loss.active``), ``reorder_pct`` > 0,
``duplicate_pct`` > 0 and the 'pareto' / 'paretonormal' distributions.

Byte timing on a shaped link: a write starts serialising when the link is
free (``busy_until``), takes ``len * 8 / (rate_gbit * 1e9)`` seconds, then
arrives after ``delay_ms + jitter`` (the total clipped at >= 0); arrival
times never decrease on one connection (TCP delivers in order). Times are
the event loop's (``loop.time()``). Like the plain fake, senders never
block (no flow control, no loss). A host pair that was never shaped keeps
the plain fake's delay and no rate limit. Builds on ``fake_transport``'s
internal pipe (``_Pipe``), so a change there must keep ``_in_flight`` and
``_run_pump``.

Example::

    wan = LinkSpec(rate_gbit=0.16, delay_ms=50, jitter_ms=5, jitter_distribution="uniform")
    net = wan_network(cfg, wan)
    handles = await start_cluster(cfg, lambda inst: net.host(inst.host))
"""

from __future__ import annotations

import asyncio
import random

from testbed.impairment import LinkSpec
from testbed.pdd.run.config import ClusterConfig
from testbed.pdd.wire.fake_transport import FakeNetwork, FakeTransport, _Pipe

EMULATED_DISTRIBUTIONS = ("uniform", "normal")  # of testbed.impairment.JITTER_DISTRIBUTIONS


def jitter_draw(rng: random.Random, jitter_s: float, normal: bool) -> float:
    """One delay variation: a gauss draw of sigma ``jitter_s`` (``normal``), else uniform
    in +-``jitter_s``; 0 without jitter (and no draw)."""
    if not jitter_s:
        return 0.0
    return rng.gauss(0.0, jitter_s) if normal else rng.uniform(-jitter_s, jitter_s)


def check_emulable(spec: LinkSpec) -> None:
    """Raise ValueError, naming the field and its value, if the fake WAN cannot
    emulate ``spec`` on a reliable in-order byte stream."""
    if not isinstance(spec, LinkSpec):
        raise ValueError(f"fake WAN: a link must be a testbed.impairment.LinkSpec, got {spec!r}")
    if spec.loss.active:
        raise ValueError(f"fake WAN: loss={spec.loss!r} (mean {spec.loss.mean_pct:g}%) cannot be "
                         "emulated on a reliable byte stream; use a LinkSpec without loss")
    if spec.reorder_pct > 0:
        raise ValueError(f"fake WAN: reorder_pct={spec.reorder_pct:g} cannot be emulated on an "
                         "in-order byte stream; use reorder_pct=0")
    if spec.duplicate_pct > 0:
        raise ValueError(f"fake WAN: duplicate_pct={spec.duplicate_pct:g} cannot be emulated on a "
                         "byte stream; use duplicate_pct=0")
    if spec.jitter_distribution not in EMULATED_DISTRIBUTIONS:
        raise ValueError(f"fake WAN: jitter_distribution={spec.jitter_distribution!r} is not "
                         f"emulated; use one of {', '.join(EMULATED_DISTRIBUTIONS)}")


class _LinkState:
    """The shared serialiser of one shaped direction (all its connections), in seconds
    and bytes per second: from a ``LinkSpec``, or unshaped (``delay_s``, no rate)."""

    def __init__(self, rng: random.Random, spec: LinkSpec | None = None, delay_s: float = 0.0):
        self.spec, self.rng = spec, rng
        if spec is None:
            self.delay_s, self.jitter_s, self.normal = delay_s, 0.0, False
            self.rate_bytes_s: float | None = None
        else:
            check_emulable(spec)
            self.delay_s, self.jitter_s = spec.delay_ms / 1e3, spec.jitter_ms / 1e3
            self.normal = spec.jitter_distribution == "normal"
            self.rate_bytes_s = spec.rate_gbit * 1e9 / 8
        self.busy_until = 0.0
        self.bytes_sent = 0

    def jitter(self) -> float:
        return jitter_draw(self.rng, self.jitter_s, self.normal)


class _ShapedPipe(_Pipe):
    def __init__(self, link: _LinkState):
        super().__init__(link.delay_s)
        self._link = link
        self._last_at = 0.0

    def put(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        now, link = loop.time(), self._link
        sent = now
        if data and link.rate_bytes_s:
            start = max(now, link.busy_until)
            link.busy_until = sent = start + len(data) / link.rate_bytes_s
        link.bytes_sent += len(data)
        at = max(self._last_at, sent + max(0.0, link.delay_s + link.jitter()))
        self._last_at = at
        if self._pump is None:
            self._pump = loop.create_task(self._run_pump())
        self._in_flight.put_nowait((at, data))


class ShapedFakeNetwork(FakeNetwork):
    """A FakeNetwork whose host pairs may have a ``LinkSpec`` per direction."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self._rng = random.Random(seed)
        self._links: dict[tuple[str, str], _LinkState] = {}

    def shape(self, src: str, dst: str, spec: LinkSpec) -> None:
        """Shape ``src`` -> ``dst`` by ``spec`` (ValueError: what it cannot emulate)."""
        self._links[(src, dst)] = _LinkState(self._rng, spec)

    def link(self, src: str, dst: str) -> _LinkState:
        if (src, dst) not in self._links:
            self._links[(src, dst)] = _LinkState(self._rng, delay_s=self.delay_s(src, dst))
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
        return (out_link.delay_s + back_link.delay_s, _ShapedPipe(out_link),
                _ShapedPipe(back_link))


def wan_network(cfg: ClusterConfig, wan: LinkSpec, intra: LinkSpec | None = None,
                seed: int = 0) -> ShapedFakeNetwork:
    """A network where each instance is a host named by ``inst.host``; hosts in
    different DCs are joined by ``wan`` (both directions), the rest by ``intra``
    (None: unshaped, no delay and no rate limit). ValueError: what the fake WAN
    cannot emulate (``check_emulable``)."""
    net = ShapedFakeNetwork(seed)
    for a in cfg.instances:
        for b in cfg.instances:
            if a.host != b.host:
                link = wan if a.dc != b.dc else intra
                if link is not None:
                    net.shape(a.host, b.host, link)
    return net
