"""Transport interface of the PDD roles, and its asyncio TCP implementation.

Owns ``Connection`` (send/recv whole ``Frame``s, byte counters, close),
``Listener``, the ``Transport`` factory interface (``serve`` / ``connect``),
the TCP backend (``TcpTransport``, ``TcpOptions`` and the module-level
``serve`` / ``connect``; its asyncio protocol is ``tcp_stream.py``) and the
per-connection handler wrapper shared with the in-memory
fake (``fake_transport.py``). Roles are written against ``Transport`` and
``Connection`` only, so the same code runs on loopback, in network
namespaces, and over the fake in unit tests.

Connection lifecycle: opened by ``connect`` or handed to the server's handler
-> frames flow (every received byte goes through a ``FrameDecoder``) -> it
ends by a local ``close()`` (later calls raise ``ConnectionClosed``), by the
peer closing (``recv`` returns the frames already received, then raises
``ConnectionClosed``; ``ProtocolError`` if the stream stopped inside a frame),
or by a bad frame (``recv`` raises ``ProtocolError``). A server closes only
the connection whose handler raised, logging why; the listener keeps serving.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
import socket
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from testbed.errors import ProtocolError, TestbedError
from testbed.pdd.wire.protocol import (MAX_BULK_PAYLOAD_BYTES, MAX_CONTROL_PAYLOAD_BYTES,
                                  MAX_FRAME_BYTES, Buffer, Frame, FrameDecoder, FrameLimits,
                                  MsgType, encode_frame_parts, filler_views)
from testbed.pdd.wire.tcp_stream import TcpStream

log = logging.getLogger(__name__)

Handler = Callable[["Connection"], Awaitable[None]]


# recv decodes at most this many frames of one read at a time (the rest on later calls),
# so that a reader can yield between them (RoleServer._read_loop)
DECODE_BATCH_FRAMES = 64


class ConnectionClosed(TestbedError):
    """The connection is closed (by this side or the peer); no more frames."""


@dataclass(frozen=True)
class TcpCounters:
    """A TCP connection's sending-side counters (Linux ``struct tcp_info``), cumulative
    since the connection opened: ``segs_out`` segments sent (retransmissions included),
    ``total_retrans`` of them retransmitted; ``rto_s`` the current retransmission timeout."""

    segs_out: int
    total_retrans: int
    rto_s: float


TCP_INFO_BYTES = 144  # through tcpi_segs_in (Linux >= 4.2)


def parse_tcp_info(buf: bytes) -> TcpCounters:
    """``TcpCounters`` from the bytes of ``getsockopt(IPPROTO_TCP, TCP_INFO)``: tcpi_rto
    (us) at offset 8, tcpi_total_retrans at 100, tcpi_segs_out at 136 (include/uapi/linux/
    tcp.h). ValueError if ``buf`` is too short (a kernel older than 4.2).

    >>> import struct
    >>> b = bytearray(TCP_INFO_BYTES)
    >>> struct.pack_into("I", b, 8, 204000); struct.pack_into("I", b, 100, 7)
    >>> struct.pack_into("I", b, 136, 900)
    >>> parse_tcp_info(bytes(b))
    TcpCounters(segs_out=900, total_retrans=7, rto_s=0.204)
    """
    if len(buf) < TCP_INFO_BYTES:
        raise ValueError(f"TCP_INFO of {len(buf)} bytes, {TCP_INFO_BYTES} needed")
    rto_us, = struct.unpack_from("I", buf, 8)
    retrans, = struct.unpack_from("I", buf, 100)
    segs_out, = struct.unpack_from("I", buf, 136)
    return TcpCounters(segs_out, retrans, rto_us / 1e6)


class Connection(abc.ABC):
    """A framed, bidirectional byte stream to one peer.

    Backends implement ``_write``, ``_read`` and ``_close_transport``; framing,
    validation, counters and the closed state live here so every backend
    behaves alike. One task may ``recv`` at a time; ``send`` may be called from
    several tasks (frames are never interleaved). A frame is handed to the
    backend as buffers plus a filler length, never joined: a KV_CHUNK's real
    bytes go out as they are and its filler from a shared zero buffer.

    >>> async def ask(conn):
    ...     await conn.send(Frame(1, Health(nonce=5)))
    ...     return await conn.recv()
    """

    def __init__(self, peer: str, max_frame_bytes: int = MAX_FRAME_BYTES,
                 limits: FrameLimits | None = None, frame_timeout_s: float | None = None):
        self.peer = peer
        self.limits = limits or FrameLimits(max_frame_bytes)
        self.max_frame_bytes = self.limits.max_frame_bytes
        self.frame_timeout_s = frame_timeout_s  # None: a frame may take forever to arrive
        self.bytes_sent = 0
        self.bytes_received = 0
        self.frames_sent = 0
        self.frames_received = 0
        self._decoder = FrameDecoder(limits=self.limits)
        self._frame_waited = 0.0  # time recv waited for the current, incomplete frame
        self._frames: deque[Frame] = deque()
        self._send_lock = asyncio.Lock()
        self._closed = False

    @property
    def peer_host(self) -> str:
        """The peer's address without its port (what a listener caps per address)."""
        return self.peer.rsplit(":", 1)[0]

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called on this side."""
        return self._closed

    async def send(self, frame: Frame) -> None:
        """Encode, validate the size of, and send one frame; waits for buffer space."""
        parts, filler = encode_frame_parts(frame, self.max_frame_bytes)
        await self._send(parts, filler)
        self.frames_sent += 1

    async def send_raw(self, data: bytes) -> None:
        """Send bytes as they are: for fault injection (malformed frames) and tests."""
        await self._send([data], 0)

    async def _send(self, parts: list[Buffer], filler: int) -> None:
        if self._closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        async with self._send_lock:
            try:
                await self._write(parts, filler)
            except OSError as err:
                raise ConnectionClosed(f"sending to {self.peer}: {err}") from err
            self.bytes_sent += sum(len(p) for p in parts) + filler

    def tcp_counters(self) -> TcpCounters | None:
        """The kernel's counters of this connection's sending side; None where the backend
        is not TCP (the in-process transport) or the socket is gone."""
        return None

    def expect_first(self, types: frozenset[MsgType]) -> None:
        """The first frame received must be of one of ``types`` (call before any recv)."""
        self.limits = dataclasses.replace(self.limits, first_types=types)
        self._decoder.limits = self.limits

    async def _read_bounded(self) -> bytes:
        """``_read``, but ProtocolError once a started frame has been waited for longer
        than ``frame_timeout_s`` in all (time spent outside ``recv`` does not count)."""
        if self.frame_timeout_s is None or not self._decoder.buffered:
            self._frame_waited = 0.0
            return await self._read()
        loop = asyncio.get_running_loop()
        left, t0 = self.frame_timeout_s - self._frame_waited, loop.time()
        try:
            return await asyncio.wait_for(self._read(), max(left, 0.0))
        except asyncio.TimeoutError:
            raise ProtocolError(f"incomplete frame from {self.peer}: "
                                f"{self._decoder.buffered} bytes, the rest not in "
                                f"{self.frame_timeout_s:g} s (frame_timeout_s)") from None
        finally:
            self._frame_waited += loop.time() - t0

    @property
    def buffered_frames(self) -> int:
        """Frames decoded and not yet returned by ``recv``, plus one when bytes wait to
        be decoded: nonzero while ``recv`` may return without reading the socket."""
        return len(self._frames) + bool(self._decoder.undecoded)

    async def recv(self) -> Frame:
        """The next frame; ConnectionClosed at the end, ProtocolError on a bad frame
        (or on a frame not complete within ``frame_timeout_s``)."""
        while not self._frames:
            if self._decoder.error is not None:
                raise self._decoder.error
            if self._decoder.undecoded:  # what the last read brought, in turns
                self._frames.extend(self._decoder.feed(b"", DECODE_BATCH_FRAMES))
                continue
            if self._closed:
                raise ConnectionClosed(f"connection to {self.peer} is closed")
            try:
                chunk = await self._read_bounded()
            except OSError as err:
                raise ConnectionClosed(f"receiving from {self.peer}: {err}") from err
            if self._closed:
                raise ConnectionClosed(f"connection to {self.peer} was closed while receiving")
            if not chunk:
                self._decoder.eof()  # raises ProtocolError if the peer stopped mid-frame
                raise ConnectionClosed(f"{self.peer} closed the connection")
            self.bytes_received += len(chunk)
            before = self._decoder.frames_decoded
            self._frames.extend(self._decoder.feed(chunk, DECODE_BATCH_FRAMES))
            if self._decoder.frames_decoded != before:
                self._frame_waited = 0.0  # a new frame started within this chunk
        self.frames_received += 1
        return self._frames.popleft()

    def close(self) -> None:
        """Close this side; idempotent. Frames not yet received are dropped."""
        if not self._closed:
            self._closed = True
            self._frames.clear()
            self._close_transport()

    async def wait_closed(self) -> None:
        """Wait until the backend has released the connection (after ``close``)."""

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
        await self.wait_closed()

    @abc.abstractmethod
    async def _write(self, parts: list[Buffer], filler: int) -> None:
        """Hand ``parts`` then ``filler`` zero bytes to the backend, waiting while its
        buffers are full. The parts may be views: once this returns the backend must
        no longer need them (it sent or copied them)."""

    @abc.abstractmethod
    async def _read(self) -> bytes:
        """Some received bytes; b"" once the peer has closed."""

    @abc.abstractmethod
    def _close_transport(self) -> None:
        """Release the backend's resources and signal end of stream to the peer."""


class Listener(abc.ABC):
    """A bound server; ``close()`` stops accepting and closes its live connections.

    Admission (``admit`` when a connection is accepted, ``identified`` once its
    HELLO is read): a *stranger* is a connection that has not said who it is
    (no HELLO yet: *pending*) or said it is no configured instance (a *guest*).
    Strangers may hold ``max_strangers`` connections, and one address
    ``max_per_address`` of them; the rest of ``max_connections`` is kept for
    the configured instances (*members*), whom no stranger can crowd out. A
    new connection that finds the strangers' room full closes the *oldest
    pending* connection (of its own address first) instead of being refused,
    so a flood of connections that never send HELLO evicts itself while an
    honest peer, whose HELLO follows its connect at once, gets in; a guest
    beyond its room is closed at its HELLO. A connection is refused outright
    only when ``max_connections`` are open and none of them is pending.
    """

    def __init__(self, max_connections: int | None = None, max_strangers: int | None = None,
                 max_per_address: int | None = None) -> None:
        self.connections: set[Connection] = set()
        self.max_connections = max_connections  # None: no cap
        self.max_strangers = max_strangers if max_strangers is not None else max_connections
        self.max_per_address = max_per_address  # None: no cap per address
        self.pending: dict[Connection, None] = {}  # accepted, no HELLO yet; oldest first
        self.guests: set[Connection] = set()  # said HELLO, not a configured instance
        self.refused = 0  # connections closed at once: max_connections open, none pending
        self.evicted = 0  # pending connections closed to make room for a newer one
        self.guests_refused = 0  # guests closed at their HELLO: the strangers' room was full

    def _strangers_of(self, host: str) -> list[Connection]:
        return [c for c in (*self.pending, *self.guests) if c.peer_host == host]

    def admit(self, conn: Connection) -> bool:
        """Count a newly accepted ``conn`` as pending, evicting the oldest pending one
        where a cap is reached; False: refused (nothing pending to evict)."""
        self.connections.add(conn)
        self.pending[conn] = None
        host = conn.peer_host
        if self.max_per_address is not None:
            mine = self._strangers_of(host)
            if len(mine) > self.max_per_address:
                oldest = next((c for c in self.pending if c is not conn and c.peer_host == host),
                              None)
                if oldest is None:
                    return self._refuse(conn, f"{len(mine) - 1} connections from {host} "
                                        "(max_connections_per_address)")
                self._evict(oldest, f"{len(mine) - 1} connections from {host} "
                            "(max_connections_per_address)")
        over_total = self.max_connections is not None and \
            len(self.connections) > self.max_connections
        over_strangers = self.max_strangers is not None and \
            len(self.pending) + len(self.guests) > self.max_strangers
        if over_total or over_strangers:
            oldest = next((c for c in self.pending if c is not conn), None)
            if oldest is not None:
                self._evict(oldest, f"{len(self.pending) + len(self.guests) - 1} connections "
                            "without a configured peer (max_strangers)")
            elif over_total:
                return self._refuse(conn, f"{len(self.connections) - 1} connections open "
                                    "(max_connections)")
        return True

    def identified(self, conn: Connection, member: bool) -> str | None:
        """``conn`` said HELLO: a configured instance (``member``) or a guest. None if it
        may stay; else why it may not (the caller closes it)."""
        self.pending.pop(conn, None)
        if member:
            return None
        host = conn.peer_host
        if self.max_strangers is not None and len(self.guests) >= self.max_strangers:
            why = f"{len(self.guests)} unconfigured peers connected (max_strangers)"
        elif self.max_per_address is not None and \
                len(self._strangers_of(host)) >= self.max_per_address:
            why = f"{len(self._strangers_of(host))} connections from {host} " \
                  "(max_connections_per_address)"
        else:
            self.guests.add(conn)
            return None
        self.guests_refused += 1
        return why

    def release(self, conn: Connection) -> None:
        """``conn`` has ended: out of every count."""
        self.connections.discard(conn)
        self.pending.pop(conn, None)
        self.guests.discard(conn)

    def _evict(self, conn: Connection, why: str) -> None:
        self.pending.pop(conn, None)
        self.evicted += 1
        if self.evicted == 1 or self.evicted % 100 == 0:
            log.warning("closing connection from %s before its HELLO to make room: %s; "
                        "%d closed so far", conn.peer, why, self.evicted)
        conn.close()

    def _refuse(self, conn: Connection, why: str) -> bool:
        self.release(conn)
        self.refused += 1
        if self.refused == 1 or self.refused % 100 == 0:
            log.warning("refusing connection from %s: %s; %d refused so far", conn.peer, why,
                        self.refused)
        return False

    @property
    @abc.abstractmethod
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the real port when asked for port 0."""

    def close(self) -> None:
        self._stop_accepting()
        for conn in list(self.connections):
            conn.close()

    async def wait_closed(self) -> None:
        """Wait until the listener has stopped (after ``close``)."""

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
        await self.wait_closed()

    @abc.abstractmethod
    def _stop_accepting(self) -> None:
        """Stop accepting new connections."""


class Transport(abc.ABC):
    """Makes listeners and connections; roles receive one of these."""

    @abc.abstractmethod
    async def serve(self, host: str, port: int, handler: Handler) -> Listener:
        """Listen on (host, port) and run ``handler(conn)`` for each accepted connection."""

    @abc.abstractmethod
    async def connect(self, host: str, port: int) -> Connection:
        """Open a connection to (host, port); OSError if nobody listens there."""


async def run_handler(listener: Listener, conn: Connection, handler: Handler) -> None:
    """Run one server-side connection: the handler's errors close it, never the server.

    The listener admits it first (``Listener.admit``: a refused one is closed at once).
    """
    if not listener.admit(conn):
        conn.close()
        await conn.wait_closed()
        return
    try:
        await handler(conn)
    except ProtocolError as err:
        log.warning("closing connection from %s: protocol error: %s", conn.peer, err)
    except ConnectionClosed as err:
        log.info("connection from %s ended: %s", conn.peer, err)
    except Exception:  # a handler bug must not take the listener down
        log.exception("closing connection from %s: handler failed", conn.peer)
    finally:
        listener.release(conn)
        conn.close()
        await conn.wait_closed()


@dataclass(frozen=True)
class TcpOptions:
    """Socket settings of a TCP connection or listener."""

    max_frame_bytes: int = MAX_FRAME_BYTES  # bound on one frame, both directions
    max_bulk_payload_bytes: int = MAX_BULK_PAYLOAD_BYTES  # KV_CHUNK real bytes received
    max_control_payload_bytes: int = MAX_CONTROL_PAYLOAD_BYTES  # other types' payloads received
    frame_timeout_s: float | None = None  # a started frame must be complete within this
    max_connections: int | None = None  # a listener closes connections beyond this many
    max_strangers: int | None = None  # of which connections without a configured peer
    max_per_address: int | None = None  # strangers' connections from one address
    nodelay: bool = True  # TCP_NODELAY: no Nagle delay on small frames (TOKENS)
    sndbuf_bytes: int | None = None  # SO_SNDBUF; None keeps the kernel's autotuning
    rcvbuf_bytes: int | None = None  # SO_RCVBUF, set before connect/listen (window scale)
    recv_queue_bytes: int = 4 << 20  # received, unread bytes before the socket is paused
    connect_timeout_s: float = 10.0
    # TCP_NOTSENT_LOWAT: the kernel takes a frame only while fewer than this many
    # bytes wait unsent in the socket (as HTTP/2 servers do for priorities). Without
    # it the autotuned send buffer queued tens of MB of one request's KV ahead of
    # the next (measured: a 27 MB transfer waited 0.7 s behind a 700 MB one), so
    # P's chunk-by-chunk interleaving of concurrent transfers had no effect.
    notsent_lowat_bytes: int | None = 256 << 10

    @property
    def limits(self) -> FrameLimits:
        return FrameLimits(self.max_frame_bytes, self.max_bulk_payload_bytes,
                           self.max_control_payload_bytes)


def _apply_buffer_sizes(sock: socket.socket, options: TcpOptions) -> None:
    if options.sndbuf_bytes is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, options.sndbuf_bytes)
    if options.rcvbuf_bytes is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, options.rcvbuf_bytes)


# Frames up to this size are coalesced per event-loop turn (TcpConnection._write)
COALESCE_MAX_BYTES = 65536


class TcpConnection(Connection):
    """A ``Connection`` over one TCP socket (an asyncio transport + ``TcpStream``)."""

    def __init__(self, stream: TcpStream, options: TcpOptions):
        transport = stream.transport
        peer = transport.get_extra_info("peername")
        super().__init__(f"{peer[0]}:{peer[1]}" if peer else "?", limits=options.limits,
                         frame_timeout_s=options.frame_timeout_s)
        self._stream, self._transport = stream, transport
        self._pending: list[Buffer] = []  # small frames waiting for this loop turn's write
        self._flush_soon = False
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(options.nodelay))
            if options.notsent_lowat_bytes is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT,
                                options.notsent_lowat_bytes)

    @property
    def sock(self) -> socket.socket:
        """The socket, for inspection only (``getsockopt``: buffer sizes, TCP_INFO)."""
        return self._transport.get_extra_info("socket")

    def tcp_counters(self) -> TcpCounters | None:
        sock = self.sock
        if sock is None or sock.fileno() < 0:
            return None
        try:
            return parse_tcp_info(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO,
                                                  TCP_INFO_BYTES))
        except (OSError, ValueError):
            return None

    async def _write(self, parts: list[Buffer], filler: int) -> None:
        if self._transport.is_closing():
            raise ConnectionResetError("connection is closing")
        if not filler and sum(map(len, parts)) <= COALESCE_MAX_BYTES:
            # A small frame (TOKENS, REPORT, HANDOFF) joins the others sent in this turn of
            # the event loop and they go in one write at its end: with TCP_NODELAY every
            # write is a syscall and a segment of its own, and a decode step sends one
            # TOKENS frame per request in its batch (the router forwards each).
            # bytes as they are; a bytearray or a view is copied, since its owner may
            # reuse it once send returns, before this turn's write
            self._pending.extend(p if isinstance(p, bytes) else bytes(p) for p in parts)
            if not self._flush_soon:
                self._flush_soon = True
                asyncio.get_running_loop().call_soon(self._flush)
            if self._transport.get_write_buffer_size() > COALESCE_MAX_BYTES:
                await self._stream.drain()  # a slow peer: wait as a large frame would
            return
        self._flush()  # what was queued before this frame goes first
        # One write per buffer, no join: asyncio sends each at once while the socket
        # has room and copies (memcpy) only what it cannot send yet.
        for part in parts + filler_views(filler) if filler else parts:
            if self._transport.is_closing():
                raise ConnectionResetError("connection is closing")
            self._transport.write(part)
            await self._stream.drain()

    async def _read(self) -> bytes:
        return await self._stream.read()

    def _flush(self) -> None:
        """Write the small frames queued in this loop turn, in order, as one buffer."""
        self._flush_soon = False
        if self._pending and not self._transport.is_closing():
            data = b"".join(self._pending)
            self._pending.clear()
            self._transport.write(data)

    def _close_transport(self) -> None:
        self._flush()  # frames sent before close() still go
        self._transport.close()  # connection_lost wakes a pending _read with b""

    async def wait_closed(self) -> None:
        await self._stream.lost


class TcpListener(Listener):
    """A ``Listener`` around an ``asyncio.Server``; runs one handler task per connection."""

    def __init__(self, handler: Handler, options: TcpOptions):
        super().__init__(options.max_connections, options.max_strangers,
                         options.max_per_address)
        self._handler, self._options = handler, options
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] = ("", 0)  # kept after close()
        self._tasks: set[asyncio.Task] = set()

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._new_stream, sock=sock, backlog=128)
        self._address = sock.getsockname()[:2]

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    def _new_stream(self) -> TcpStream:
        return TcpStream(self._options.recv_queue_bytes, on_connected=self._accept)

    def _accept(self, stream: TcpStream) -> None:
        conn = TcpConnection(stream, self._options)
        task = asyncio.get_running_loop().create_task(run_handler(self, conn, self._handler))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
        others = [t for t in self._tasks if t is not asyncio.current_task()]
        if others:  # the handlers end once close() has closed their connections
            await asyncio.gather(*others, return_exceptions=True)


class TcpTransport(Transport):
    """Real TCP, with the same options on every socket it makes.

    Example: ``await TcpTransport(TcpOptions(rcvbuf_bytes=8 << 20)).connect("10.0.0.2", 7000)``.
    """

    def __init__(self, options: TcpOptions | None = None):
        self.options = options or TcpOptions()

    async def serve(self, host: str, port: int, handler: Handler) -> Listener:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        sock = socket.socket(infos[0][0], socket.SOCK_STREAM)
        listener = TcpListener(handler, self.options)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _apply_buffer_sizes(sock, self.options)  # inherited by accepted sockets
            sock.bind(infos[0][4])
            sock.setblocking(False)
            await listener.start(sock)
        except BaseException:
            sock.close()
            raise
        return listener

    async def connect(self, host: str, port: int) -> Connection:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        sock = socket.socket(infos[0][0], socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            _apply_buffer_sizes(sock, self.options)  # before connect: sets the window scale
            await asyncio.wait_for(loop.sock_connect(sock, infos[0][4]),
                                   self.options.connect_timeout_s)
            _, stream = await loop.create_connection(
                lambda: TcpStream(self.options.recv_queue_bytes), sock=sock)
        except BaseException:
            sock.close()
            raise
        return TcpConnection(stream, self.options)


async def serve(host: str, port: int, handler: Handler,
                options: TcpOptions | None = None) -> Listener:
    """Serve PDD frames over TCP on (host, port); port 0 picks a free port.

    >>> async def echo(conn):
    ...     while True:
    ...         await conn.send(await conn.recv())
    >>> # listener = await serve("127.0.0.1", 0, echo); host, port = listener.address
    """
    return await TcpTransport(options).serve(host, port, handler)


async def connect(host: str, port: int, options: TcpOptions | None = None) -> Connection:
    """Open a TCP connection to a PDD server.

    >>> # async with await connect("127.0.0.1", port) as conn:
    >>> #     await conn.send(Frame(1, Hello(Role.CLIENT, "c0")))
    """
    return await TcpTransport(options).connect(host, port)
