"""In-memory fake of the PDD transport, for unit tests of role state machines.

Owns ``FakeNetwork`` (listeners by (host, port), a one-way delay per ordered
pair of host names), ``FakeTransport`` (one host's ``serve`` / ``connect``),
``FakeConnection`` and ``FakeListener``. It implements the interfaces of
``transport.py`` and reuses its framing path: frames are encoded to bytes,
carried in order, and decoded by a ``FrameDecoder`` at the far end, so byte
counters, validation, malformed-frame handling (``send_raw``) and the
server's close-only-that-connection behaviour are the same as over TCP.

Lifecycle: ``net = FakeNetwork()`` -> ``net.host("md").serve(...)`` ->
``net.host("p").connect("md", port)`` (takes one round trip of delay) ->
bytes arrive ``delay_s`` after being sent, in order -> ``close()`` delivers
end-of-stream to the peer after the same delay.

Differences from TCP, on purpose: no bandwidth limit, loss or flow control
(``send`` never waits for buffer space); a send to a peer that has already
closed raises ``ConnectionClosed`` at once (TCP may accept it and fail later).
"""

from __future__ import annotations

import asyncio
import errno
import itertools

from testbed.pdd.wire.protocol import MAX_FRAME_BYTES, filler_views
from testbed.pdd.wire.transport import Connection, Handler, Listener, Transport, run_handler

_ANY_ADDRESS = ("", "0.0.0.0", "::")


class _Pipe:
    """One direction of a connection: bytes arrive in order, ``delay_s`` after ``put``."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self._inbox: asyncio.Queue[bytes] = asyncio.Queue()  # b"" marks end of stream
        self._in_flight: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        self._pump: asyncio.Task | None = None
        self._eof_seen = False

    def put(self, data: bytes) -> None:
        """Send ``data`` down the pipe; b"" sends end-of-stream."""
        if self.delay_s <= 0:
            self._inbox.put_nowait(data)
            return
        loop = asyncio.get_running_loop()
        if self._pump is None:
            self._pump = loop.create_task(self._run_pump())
        self._in_flight.put_nowait((loop.time() + self.delay_s, data))

    async def reserve(self, n: int) -> None:
        """Wait until the pipe takes ``n`` more bytes (here: at once; a pipe with a send
        buffer, ``fluid_net``'s, waits for room as a TCP writer does)."""

    def wake_reader(self) -> None:
        """Make a pending ``get`` return b"" now (the local side closed)."""
        self._inbox.put_nowait(b"")

    async def get(self) -> bytes:
        """The next delivered bytes; b"" at (and after) end-of-stream."""
        if self._eof_seen:
            return b""
        data = await self._inbox.get()
        self._eof_seen = not data
        return data

    async def _run_pump(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            deliver_at, data = await self._in_flight.get()
            wait_s = deliver_at - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            self._inbox.put_nowait(data)
            if not data:
                return


class FakeConnection(Connection):
    """One end of an in-memory connection; made by ``FakeTransport.connect``."""

    def __init__(self, peer: str, inbound: _Pipe, outbound: _Pipe, max_frame_bytes: int):
        super().__init__(peer, max_frame_bytes)
        self._inbound, self._outbound = inbound, outbound
        self._peer_conn: FakeConnection | None = None

    async def _write(self, parts: list, filler: int) -> None:
        if self._peer_conn is not None and self._peer_conn.closed:
            raise ConnectionResetError(errno.ECONNRESET, "peer has closed the connection")
        data = b"".join(parts + filler_views(filler))  # one write, as TCP's would arrive
        if data:
            await self._outbound.reserve(len(data))
            self._outbound.put(data)

    async def _read(self) -> bytes:
        return await self._inbound.get()

    def _close_transport(self) -> None:
        self._outbound.put(b"")
        self._inbound.wake_reader()


class FakeListener(Listener):
    """A fake server bound to (host name, port) in a ``FakeNetwork``."""

    def __init__(self, network: FakeNetwork, address: tuple[str, int], handler: Handler):
        super().__init__()
        self._network, self._address, self.handler = network, address, handler
        self._tasks: set[asyncio.Task] = set()

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    def accept(self, conn: FakeConnection) -> None:
        """Run the handler on a new server-side connection."""
        task = asyncio.get_running_loop().create_task(run_handler(self, conn, self.handler))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop_accepting(self) -> None:
        self._network.unbind(self._address, self)

    async def wait_closed(self) -> None:
        others = [t for t in self._tasks if t is not asyncio.current_task()]
        if others:  # the handlers end once close() has closed their connections
            await asyncio.gather(*others, return_exceptions=True)


class FakeNetwork:
    """Hosts by name, joined by in-memory links with a one-way delay per direction.

    >>> net = FakeNetwork(delay_s=0.001)
    >>> net.set_delay("p", "md", 0.040)  # P -> MD takes 40 ms, MD -> P keeps 1 ms
    >>> p, md = net.host("p"), net.host("md")
    >>> # listener = await md.serve("md", 0, handler); conn = await p.connect(*listener.address)
    """

    def __init__(self, delay_s: float = 0.0, max_frame_bytes: int = MAX_FRAME_BYTES):
        self.default_delay_s = delay_s
        self.max_frame_bytes = max_frame_bytes
        self._delays: dict[tuple[str, str], float] = {}
        self._listeners: dict[tuple[str, int], FakeListener] = {}
        self._ports = itertools.count(40000)

    def host(self, name: str) -> FakeTransport:
        """The transport that a role running on host ``name`` uses."""
        return FakeTransport(self, name)

    def set_delay(self, src: str, dst: str, delay_s: float) -> None:
        """Set the one-way delay of bytes going from host ``src`` to host ``dst``."""
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self._delays[(src, dst)] = delay_s

    def delay_s(self, src: str, dst: str) -> float:
        return self._delays.get((src, dst), self.default_delay_s)

    def next_port(self) -> int:
        return next(self._ports)

    def bind(self, address: tuple[str, int], listener: FakeListener) -> None:
        if address in self._listeners:
            raise OSError(errno.EADDRINUSE, f"address {address[0]}:{address[1]} in use")
        self._listeners[address] = listener

    def unbind(self, address: tuple[str, int], listener: FakeListener) -> None:
        if self._listeners.get(address) is listener:
            del self._listeners[address]

    def listener_at(self, address: tuple[str, int]) -> FakeListener:
        if address not in self._listeners:
            raise ConnectionRefusedError(errno.ECONNREFUSED,
                                         f"nothing listens on {address[0]}:{address[1]}")
        return self._listeners[address]


class FakeTransport(Transport):
    """Host ``name``'s view of a ``FakeNetwork``: ``serve`` binds there, ``connect`` leaves there.

    Example: ``conn = await net.host("p").connect("md", 7000)``.
    """

    CONNECTION: type = FakeConnection  # what connect makes (a subclass may carry frames)

    def __init__(self, network: FakeNetwork, name: str):
        self.network, self.name = network, name

    async def serve(self, host: str, port: int, handler: Handler) -> Listener:
        if host not in _ANY_ADDRESS and host != self.name:
            raise OSError(errno.EADDRNOTAVAIL, f"host {self.name!r} cannot bind {host!r}")
        address = (self.name, port or self.network.next_port())
        listener = FakeListener(self.network, address, handler)
        self.network.bind(address, listener)
        return listener

    def _pipes(self, host: str) -> tuple[float, object, object]:
        """(handshake round trip, pipe to the server, pipe back): subclasses shape them."""
        out_s, back_s = self.network.delay_s(self.name, host), self.network.delay_s(host, self.name)
        return out_s + back_s, _Pipe(out_s), _Pipe(back_s)

    async def connect(self, host: str, port: int) -> Connection:
        net = self.network
        net.listener_at((host, port))  # refuse at once, as TCP does
        handshake_s, to_server, to_client = self._pipes(host)
        await asyncio.sleep(handshake_s)
        listener = net.listener_at((host, port))
        conn = self.CONNECTION
        client = conn(f"{host}:{port}", to_client, to_server, net.max_frame_bytes)
        server = conn(f"{self.name}:{net.next_port()}", to_server, to_client,
                      net.max_frame_bytes)
        client._peer_conn, server._peer_conn = server, client
        listener.accept(server)
        return client
