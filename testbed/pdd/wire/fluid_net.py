"""The network of a virtual-clock run: shaped channels shared by TCP-like flows.

Owns ``FluidNetwork`` (hosts, the channels of their paths, byte counters),
``FluidChannel`` (one shaped direction), ``FluidTransport`` (a host's
``serve`` / ``connect``, the fake transport's API) and ``FluidConnection``
(frames carried as objects with their encoded size: counted, not
materialised).

The model, per channel (one direction of a link, as the emulator's
channels: a host's up and down link, the WAN's a>b and b>a):

- **Rate, shared as TCP flows share a bottleneck.** Every connection
  direction with bytes queued on the channel is one flow; the channel's
  rate is divided equally among its backlogged flows, the fluid
  processor-sharing model of TCP's long-run fairness (Massoulie and Roberts,
  "Bandwidth sharing: objectives and algorithms", IEEE/ACM ToN 10(3),
  2002; Ben Fredj et al., "Statistical bandwidth sharing: a study of
  congestion at flow level", SIGCOMM 2001). Cross traffic is ``bulk``
  flows that are always backlogged. A flow's bytes leave in the order
  they were written (one TCP stream).
- **Segments.** A write is served in segments of ``SEGMENT_S`` (2 ms) of
  the channel's rate, at least 64 KiB, each delivered when it is through:
  a receiver counts a large frame's bytes as they arrive, as over TCP.
- **Headers.** A channel's rate is its wire rate; payload goes at 1448/1514
  of it (a full TCP segment with timestamps, its IP and Ethernet headers),
  and its byte counter counts wire bytes, as htb's does.
- **Send buffer.** A connection holds at most ``SNDBUF_BDPS`` (2) of its
  path's bandwidth-delay products of bytes not yet through before its
  writer waits (``reserve``), as a TCP writer blocks on a full socket: a
  small KV chunk written behind a large transfer waits for what is
  buffered ahead of it, not for the whole transfer.
- **Small writes.** A write of at most ``SMALL_BYTES`` (4 KB: a token or
  control frame) that finds its connection idle is served at once at the
  share a new flow would get, without joining the sharing (its bytes are
  counted, not taken from the other flows).
- **Delay.** A byte that finished serialising arrives after the path's
  one-way delay (the sum of its channels' delays, plus the bottleneck's
  jitter draw, 'uniform' or 'normal'), never before an earlier byte of the
  same stream.
- **One bottleneck per path.** A path serialises on its slowest channel
  (the WAN for every cross-DC path of the shipped topologies, the
  receiver's down link inside a DC); the others add their delay only.
- **Rate changes and link state** act at once: a bandwidth schedule sets
  the rate; a channel that is down carries nothing until it is up again,
  and then each connection that lost bytes to it (it had some queued, or
  wrote while the link was down) waits for its next retransmission
  timeout: RTO = its RTT + 200 ms, backed off 1, 2, 4... x from its first
  loss (RFC 6298, Linux's minimum RTO), so a 3 s outage costs a connection
  that lost bytes at its start up to 1.5 s more.

- **Loss** (``fluid_loss``): a channel's loss process is drawn over each
  segment's GSO frames (what the emulator's backends drop); a lost frame
  delays its segment (and, in order, what of the stream arrives behind it
  meanwhile) by what RACK-TLP and the retransmission timeout take to
  recover it, and its retransmission is served again. A connection's
  ``tcp_counters`` are the model's TCP_INFO (segments sent, retransmitted).
- **Duplication** changes no timing: the receiving TCP drops the copy, and
  the copy takes no shaped rate (as on the userspace backend).

What it leaves out, so a scenario that needs it is refused before the run
(``testbed.scenario.virtual.unsupported``): reordering. Left out without a
refusal: slow start (the emulated hosts keep
``tcp_slow_start_after_idle`` off and reuse their connections, so only a
connection's first window would ramp) and the bottleneck's standing queue.

Example::

    net = FluidNetwork()
    wan = net.channel("wan", "a>b", rate_gbit=0.1, delay_ms=20)
    net.route("p1", "md1", [wan])
    conn = await net.host("p1").connect("md1", 7100)
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections import deque
from collections.abc import Sequence

from testbed.impairment import LossSpec
from testbed.pdd.wire.fake_transport import FakeNetwork, FakeTransport, _Pipe
from testbed.pdd.wire.fake_wan import jitter_draw
from testbed.pdd.wire.fluid_loss import MSS, PacketLoss, frame_bytes, recovery
from testbed.pdd.wire.messages import KvChunk, Tokens, _Fixed
from testbed.pdd.wire.protocol import HEADER_SIZE, Frame, FrameDecoder, encode_frame_parts
from testbed.pdd.wire.transport import Connection, ConnectionClosed, TcpCounters

_EPS_BYTES = 1e-6
# a write is served and delivered in segments of at most this many seconds of its
# channel's rate (and at least SEGMENT_MIN_BYTES): a receiver sees a large KV frame
# arrive as TCP delivers it, bit by bit, not all at once when its last byte is through
SEGMENT_S = 0.002
SEGMENT_MIN_BYTES = 64 * 1024
# a connection holds at most this many bandwidth-delay products of its path (at the
# bottleneck's rate now) of bytes not yet through before its writer waits: Linux grows a
# socket's send buffer to about twice its congestion window (tcp_sndbuf_expand), and a
# window fills the path and its BDP-sized bottleneck queue
SNDBUF_BDPS = 2.0
SNDBUF_MIN_BYTES = 256 * 1024
# payload bytes per wire byte: a full TCP segment (MSS 1448 with timestamps) in a
# 1500-byte IP packet plus its 14-byte Ethernet header, as htb counts it
PAYLOAD_SHARE = 1448 / 1514
# a write this small (a control or token frame) that finds its connection idle is served
# at once at the share a new flow would get, without joining the sharing: its bytes are
# counted but not taken from the other flows (at most 4 KB against segments of 64 KiB
# and more), which saves the sharing's bookkeeping on the most frequent frames
SMALL_BYTES = 4096
# the payload of a queue item that is a retransmission: served (it takes the rate and
# counts as wire bytes) and delivered to nobody
_RETRANSMIT = object()


class FluidChannel:
    """One shaped direction: rate (bytes/s), delay and jitter; its backlogged flows share
    the rate equally (see the module docstring)."""

    def __init__(self, link: str, direction: str, rate_gbit: float, delay_ms: float = 0.0,
                 jitter_ms: float = 0.0, jitter_distribution: str = "uniform",
                 rng: random.Random | None = None, loss: LossSpec | None = None,
                 duplicate_pct: float = 0.0):
        self.link, self.direction = link, direction
        self.rate_gbit = rate_gbit
        self.delay_s, self.jitter_s = delay_ms / 1e3, jitter_ms / 1e3
        self.normal = jitter_distribution == "normal"
        self.rng = rng or random.Random(0)
        self.up = True
        self.loss: PacketLoss | None = None  # fluid_loss: what a lost packet costs a stream
        self._set_loss(loss)
        # copies of packets: taken by nobody's rate and dropped by the receiving TCP (see
        # set); kept to be reported
        self.duplicate_pct = duplicate_pct
        self.bulk_flows = 0  # cross traffic: flows that always have bytes to send
        self.bytes = 0  # every byte that finished serialising (flows and cross traffic)
        self.cross_bytes = 0.0
        self.frames = 0
        self._flows: dict[_FluidPipe, deque[list]] = {}  # insertion order: deterministic
        self._held: dict[_FluidPipe, deque[list]] = {}  # waiting for a retransmission timeout
        self._lost_at: dict[_FluidPipe, float] = {}  # first send lost while the link was down
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None

    @property
    def id(self) -> str:
        return f"{self.link}/{self.direction}"

    @property
    def rate_bytes_s(self) -> float:
        """Payload bytes per second (the wire rate less the headers)."""
        return self.rate_gbit * 1e9 / 8 * PAYLOAD_SHARE if self.up else 0.0

    @property
    def flows(self) -> int:
        """Flows sharing the rate now: connections with bytes queued, and cross traffic."""
        return len(self._flows) + self.bulk_flows

    def pass_small(self, n: int) -> None:
        """Count a small write served outside the sharing (``_FluidPipe.put``)."""
        self.bytes += n
        self.frames += 1

    @property
    def backlog_bytes(self) -> int:
        return int(sum(sum(item[0] for item in q) for q in self._flows.values()))  # unserved

    def jitter(self) -> float:
        return jitter_draw(self.rng, self.jitter_s, self.normal)

    # -- changes ------------------------------------------------------------
    def _set_loss(self, loss: LossSpec | None) -> None:
        self.loss = PacketLoss(loss, self.rng) if loss is not None and loss.active else None

    def set(self, now: float, rate_gbit: float | None = None, delay_ms: float | None = None,
            jitter_ms: float | None = None, up: bool | None = None,
            bulk_flows: int | None = None, loss: LossSpec | None = None,
            duplicate_pct: float | None = None) -> None:
        """Change the channel at ``now``: what was served so far was served at the old
        rate. A duplicated packet changes nothing but the figure kept: the receiving TCP
        drops the copy (answering with a duplicate SACK, RFC 2883, which Linux does not
        read as loss) and the copy takes no shaped rate, as the userspace backend makes
        it (after the shaper; netem's copy passes the shaper again: docs/backends.md)."""
        self._advance(now)
        if loss is not None:
            self._set_loss(loss)
        if duplicate_pct is not None:
            self.duplicate_pct = duplicate_pct
        if rate_gbit is not None:
            self.rate_gbit = rate_gbit
        if delay_ms is not None:
            self.delay_s = delay_ms / 1e3
        if jitter_ms is not None:
            self.jitter_s = jitter_ms / 1e3
        if up is False and self.up:
            for pipe in self._flows:  # their bytes in the air are lost: each waits for RTO
                self._lost_at.setdefault(pipe, now)
        if up is True and not self.up:
            self.up = True
            self._after_outage(now)
        if up is not None:
            self.up = up
        if bulk_flows is not None:
            self.bulk_flows = bulk_flows
        self._reschedule(now)

    def enqueue(self, pipe: "_FluidPipe", size: int, payload: object, now: float) -> None:
        """Queue ``size`` bytes of ``pipe``'s stream; ``payload`` is handed to the pipe
        when they are through (bytes, a frame, or None for a segment of one)."""
        self._advance(now)
        item = [float(size), payload, size]
        if pipe in self._held:
            self._held[pipe].append(item)
            return
        if not self.up:
            self._lost_at.setdefault(pipe, now)  # sent into a dead link: lost
        self._flows.setdefault(pipe, deque()).append(item)
        self._reschedule(now)

    # -- a link that was down ------------------------------------------------
    def _after_outage(self, now: float) -> None:
        """The link is up again: each connection whose bytes were lost while it was down
        sends again at its next retransmission timeout, RFC 6298's backoff from its
        first loss: RTO, then 2, 4, 8... x RTO later (RTO = its path's RTT + Linux's 200
        ms minimum); one with nothing lost sends at once."""
        loop = asyncio.get_running_loop()
        for pipe, t_lost in sorted(self._lost_at.items(), key=lambda kv: kv[1]):
            rto = pipe.rto_s()
            resume, k = t_lost + rto, 1
            while resume < now:
                k += 1
                resume = t_lost + rto * (2 ** k - 1)
            queue = self._flows.pop(pipe, None)
            if queue is None:
                continue
            self._held[pipe] = queue
            loop.call_at(resume, self._release, pipe)
        self._lost_at.clear()

    def _release(self, pipe: "_FluidPipe") -> None:
        now = asyncio.get_running_loop().time()
        self._advance(now)
        queue = self._held.pop(pipe, None)
        if queue:
            self._flows[pipe] = queue
        self._reschedule(now)

    # -- the fluid server ---------------------------------------------------
    def _advance(self, now: float) -> None:
        """Serve the backlog from the last event to ``now``; deliver what completes."""
        t, rate = self._last, self.rate_bytes_s
        self._last = now
        if rate <= 0:
            return
        while t < now:
            n = len(self._flows) + self.bulk_flows
            if not self._flows:
                self.cross_bytes += rate * (now - t) if self.bulk_flows else 0.0
                return
            per = rate / n
            head = min(q[0][0] for q in self._flows.values())
            dt = head / per
            if t + dt > now:  # nothing completes before now: serve (now - t) and stop
                served = per * (now - t)
                for q in self._flows.values():
                    q[0][0] -= served
                self.cross_bytes += served * self.bulk_flows
                return
            t += dt
            self.cross_bytes += head * self.bulk_flows
            for pipe in list(self._flows):
                q = self._flows[pipe]
                q[0][0] -= head
                if q[0][0] <= _EPS_BYTES:
                    _, payload, size = q.popleft()
                    self.bytes += size
                    if payload is _RETRANSMIT:
                        if not q:
                            del self._flows[pipe]
                        continue
                    self.frames += 1
                    pipe.served(size)
                    late, resent = pipe.recover(size, tail=not q and not pipe.queued)
                    if resent:  # served again before the stream's next bytes
                        q.appendleft([float(resent), _RETRANSMIT, resent])
                    pipe.deliver(payload, t, size, late)
                    if not q:
                        del self._flows[pipe]

    def _reschedule(self, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        rate = self.rate_bytes_s
        if not self._flows or rate <= 0:
            return
        per = rate / (len(self._flows) + self.bulk_flows)
        head = min(q[0][0] for q in self._flows.values())
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(now + head / per, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        self._advance(now)
        self._reschedule(now)

    def counted_bytes(self, now: float) -> int:
        """Wire bytes serialised by ``now`` (payload and headers), cross traffic included
        (links.csv's counter, as htb's)."""
        self._advance(now)
        self._reschedule(now)
        return int((self.bytes + self.cross_bytes) / PAYLOAD_SHARE)


class _FluidPipe(_Pipe):
    """One direction of a connection over a path: queued on its bottleneck channel, then
    delivered after the path's delay, in order. Delivery is a timer on the loop for the
    oldest bytes in flight (no pump task: a frame costs two timers, not a task switch)."""

    def __init__(self, bottleneck: FluidChannel | None, extra_delay_s: float,
                 rtt_s: float = 0.0, path: tuple[FluidChannel, ...] = ()):
        super().__init__(extra_delay_s + (bottleneck.delay_s if bottleneck else 0.0))
        self._bottleneck, self._extra_delay_s = bottleneck, extra_delay_s
        self._rtt_s = rtt_s
        self._path = path
        self._last_write = -math.inf
        # TCP_INFO's sending-side counters, in MSS segments (tcp_counters)
        self.segs_out = 0
        self.total_retrans = 0
        self._last_at = 0.0
        self._queued = 0  # bytes written and not yet through the bottleneck
        self._room = asyncio.Event()
        self._flight: deque[tuple[float, bytes]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def rto_s(self) -> float:
        """The retransmission timeout of this connection: its path's RTT + 200 ms (Linux's
        minimum RTO, TCP_RTO_MIN, added to the smoothed RTT on a steady path)."""
        return self._rtt_s + 0.2

    @property
    def queued(self) -> int:
        """Bytes written and not yet through the bottleneck."""
        return self._queued

    def recover(self, size: int, tail: bool) -> tuple[float, int]:
        """A segment of ``size`` bytes through the path's lossy channels (fluid_loss):
        (how much later it is delivered, bytes served again)."""
        losses = [c.loss for c in self._path if c.loss is not None]
        if not losses:
            return 0.0, 0
        frame = frame_bytes(self._bottleneck.rate_bytes_s) if self._bottleneck else MSS
        late, resent = recovery(losses, size, tail, self._rtt_s, self.rto_s(), frame)
        segs = -(-resent // MSS)
        self.segs_out += segs
        self.total_retrans += segs
        return late, resent

    def sndbuf_bytes(self) -> float:
        b = self._bottleneck
        return max(SNDBUF_MIN_BYTES, SNDBUF_BDPS * b.rate_bytes_s * self._rtt_s) if b else 0.0

    async def reserve(self, n: int) -> None:
        """Wait while the bytes not yet through fill the send buffer (one write larger
        than the buffer goes once the pipe is empty)."""
        while self._bottleneck is not None and self._queued > 0 \
                and self._queued + n > self.sndbuf_bytes():
            self._room.clear()
            await self._room.wait()

    def served(self, n: int) -> None:
        self._queued -= n
        self._room.set()

    def put(self, data: bytes) -> None:
        """Send bytes (b"": end of stream); ``get`` returns them, in pieces."""
        self.send(data, len(data))

    def send(self, payload: object, size: int) -> None:
        """Send ``size`` bytes that carry ``payload`` (bytes, split with the segments; or
        a frame, delivered with its last segment); a size 0 ends the stream."""
        now = asyncio.get_running_loop().time()
        neck = self._bottleneck
        self.segs_out += -(-size // MSS)
        if not size or neck is None:  # end of stream, or an unshaped path
            self.deliver(payload, now, size)
            return
        seg = max(SEGMENT_MIN_BYTES, int(neck.rate_gbit * 1e9 / 8 * SEGMENT_S))
        followed, self._last_write = now - self._last_write < self._rtt_s, now
        if size <= SMALL_BYTES and self._queued == 0 and neck.rate_bytes_s > 0:
            neck.pass_small(size)  # served at its fair share at once: see SMALL_BYTES
            late, resent = self.recover(size, tail=not followed)
            neck.bytes += resent
            self.deliver(payload, now + size / (neck.rate_bytes_s / (neck.flows + 1)), size,
                         late)
            return
        self._queued += size
        if size <= seg:
            neck.enqueue(self, size, payload, now)
            return
        raw = isinstance(payload, (bytes, bytearray, memoryview))
        for i in range(0, size, seg):
            n = min(seg, size - i)
            part = payload[i:i + n] if raw else (payload if i + n >= size else None)
            neck.enqueue(self, n, part, now)

    def deliver(self, payload: object, t_serialised: float, size: int | None = None,
                late_s: float = 0.0) -> None:
        b = self._bottleneck
        delay = self._extra_delay_s + (max(0.0, b.delay_s + b.jitter()) if b else 0.0) + late_s
        at = max(self._last_at, t_serialised + delay)
        self._last_at = at
        self._flight.append((at, payload, len(payload) if size is None else size))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_at(at, self._arrive)

    def _arrive(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        while self._flight and self._flight[0][0] <= now:
            _, payload, size = self._flight.popleft()
            self._inbox.put_nowait((size, payload))
        if self._flight:
            self._timer = asyncio.get_running_loop().call_at(self._flight[0][0], self._arrive)

    def wake_reader(self) -> None:
        self._inbox.put_nowait((0, None))

    async def get_item(self) -> tuple[int, object]:
        """The next (bytes arrived, what they carried: bytes, a frame or None); (0, None)
        at (and after) the end of the stream."""
        if self._eof_seen:
            return 0, None
        item = await self._inbox.get()
        self._eof_seen = item[0] == 0
        return item

    async def get(self) -> bytes:
        """The next bytes delivered; b"" at (and after) the end of the stream."""
        size, payload = await self.get_item()
        return payload if size else b""


class FluidConnection(Connection):
    """One end of a connection over a ``FluidNetwork``: frames travel as objects with
    their encoded size (counted, never materialised: a KV_CHUNK's filler is a number),
    so a virtual run at k = 1 moves gigabytes of KV without holding them.

    A frame is encoded to learn its size (and to check it against the frame limit),
    except TOKENS and the fixed-layout messages, whose size is their layout's;
    the receiver gets the object itself, except a frame whose message holds a dict
    (HELLO, REQUEST, REPORT, BIND), which is decoded from its bytes so the two ends
    never share a mutable field. ``bytes_received`` grows with each segment as it
    arrives, as over TCP. ``send_raw`` (malformed bytes) is not carried: raw bytes are
    not frames."""

    _COPIED = frozenset({"Hello", "Request", "Report", "Bind"})

    def __init__(self, peer: str, inbound: _FluidPipe, outbound: _FluidPipe,
                 max_frame_bytes: int):
        super().__init__(peer, max_frame_bytes)
        self._inbound, self._outbound = inbound, outbound
        self._peer_conn: FluidConnection | None = None

    async def send(self, frame: Frame) -> None:
        if self._closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        msg = frame.message
        if isinstance(msg, Tokens):  # the most frequent frames: their size without encoding
            size = HEADER_SIZE + Tokens.LAYOUT.size + 4 * len(msg.token_ids)
        elif isinstance(msg, _Fixed):
            size = HEADER_SIZE + msg.LAYOUT.size
        else:
            parts, filler = encode_frame_parts(frame, self.max_frame_bytes)
            size = sum(len(p) for p in parts) + filler
        if type(msg).__name__ in self._COPIED:
            frame = FrameDecoder(self.max_frame_bytes).feed(b"".join(parts))[0]
        elif isinstance(msg, KvChunk) and not isinstance(msg.data, bytes):
            frame = Frame(frame.request_id, dataclasses.replace(msg, data=bytes(msg.data)))
        async with self._send_lock:
            if self._peer_conn is not None and self._peer_conn.closed:
                raise ConnectionClosed(f"sending to {self.peer}: peer has closed the "
                                       "connection")
            await self._outbound.reserve(size)
            self._outbound.send(frame, size)
            self.bytes_sent += size
        self.frames_sent += 1

    async def send_raw(self, data: bytes) -> None:
        raise ConnectionClosed("raw bytes are not carried by the virtual clock's network")

    def tcp_counters(self) -> TcpCounters | None:
        """The model's TCP_INFO: segments sent and retransmitted (fluid_loss), the RTO."""
        out = self._outbound
        return TcpCounters(out.segs_out, out.total_retrans, out.rto_s())

    async def recv(self) -> Frame:
        while True:
            if self._closed:
                raise ConnectionClosed(f"connection to {self.peer} is closed")
            size, payload = await self._inbound.get_item()
            if self._closed:
                raise ConnectionClosed(f"connection to {self.peer} was closed while receiving")
            if not size:
                raise ConnectionClosed(f"{self.peer} closed the connection")
            self.bytes_received += size
            if payload is not None:
                self.frames_received += 1
                return payload

    async def _write(self, parts: list, filler: int) -> None:  # unused: send is overridden
        raise NotImplementedError

    async def _read(self) -> bytes:  # unused: recv is overridden
        raise NotImplementedError

    def _close_transport(self) -> None:
        self._outbound.send(None, 0)
        self._inbound.wake_reader()


class FluidNetwork(FakeNetwork):
    """Hosts joined by paths of ``FluidChannel``s (see the module docstring)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.rng = random.Random(seed)
        self.channels: dict[str, FluidChannel] = {}
        self._paths: dict[tuple[str, str], tuple[FluidChannel, ...]] = {}

    def channel(self, link: str, direction: str, rate_gbit: float, delay_ms: float = 0.0,
                jitter_ms: float = 0.0, jitter_distribution: str = "uniform",
                loss: LossSpec | None = None, duplicate_pct: float = 0.0) -> FluidChannel:
        ch = FluidChannel(link, direction, rate_gbit, delay_ms, jitter_ms, jitter_distribution,
                          self.rng, loss, duplicate_pct)
        self.channels[ch.id] = ch
        return ch

    def route(self, src: str, dst: str, channels: Sequence[FluidChannel]) -> None:
        """Bytes from host ``src`` to host ``dst`` cross ``channels`` in order."""
        self._paths[(src, dst)] = tuple(channels)

    def path(self, src: str, dst: str) -> tuple[FluidChannel, ...]:
        return self._paths.get((src, dst), ())

    def pipe(self, src: str, dst: str) -> _FluidPipe:
        chans = self.path(src, dst)
        if not chans:
            return _FluidPipe(None, 0.0)
        # the slowest channel serialises; on a tie the last one (the receiver's side)
        neck = min(reversed(chans), key=lambda c: c.rate_gbit)
        return _FluidPipe(neck, sum(c.delay_s for c in chans if c is not neck),
                          self.one_way_s(src, dst) + self.one_way_s(dst, src), chans)

    def one_way_s(self, src: str, dst: str) -> float:
        return sum(c.delay_s for c in self.path(src, dst))

    def host(self, name: str) -> FakeTransport:
        return FluidTransport(self, name)


class FluidTransport(FakeTransport):
    """Host ``name``'s view of a ``FluidNetwork`` (the fake transport's API; its
    connections are ``FluidConnection``s)."""

    network: FluidNetwork

    CONNECTION = FluidConnection

    def _pipes(self, host: str) -> tuple[float, object, object]:
        net = self.network
        rtt = net.one_way_s(self.name, host) + net.one_way_s(host, self.name)
        return rtt, net.pipe(self.name, host), net.pipe(host, self.name)
