"""The asyncio protocol under each TCP connection of the PDD transport.

Owns the receive side's chunk queue (chunks are handed on as the kernel
delivered them, without the extra copies of ``asyncio.StreamReader``), the
pausing of a socket whose reader lags by more than ``recv_queue_bytes``, and
write flow control (``drain``). Knows nothing about frames: ``transport.py``'s
``TcpConnection`` reads chunks from it and decodes them.

Each time the event loop finds the socket readable it takes everything the
kernel holds, up to ``READ_BYTES`` (a ``BufferedProtocol``: one ``recv_into``
into this stream's buffer, then one copy out). The buffer is an anonymous
mapping, so only the pages a read has written are resident: an idle or
control connection costs a page or two, not 4 MiB (a zero-filled
``bytearray`` would; tests/unit/test_pdd_hostile.py's RSS bounds caught it).
A plain ``asyncio.Protocol`` gets at most 256 KiB per loop iteration, and a
role's event loop runs one iteration per decode step while its real compute
blocks it: with 20 ms steps
that capped a connection at 12.8 MB/s (this buffer: 88.8 MB/s), so MD's KV
reception, not the emulated WAN, set the baseline's transfer times
(quickstart on a 2-core machine where a step of 14 sequences took ~40 ms:
0.037 of the 0.4 Gbit/s emulated line while KV was queued; a 28 MB transfer
took 5.7 s). A real decoder's NIC writes KV into memory while it computes.

Lifecycle: created by the event loop's protocol factory -> ``connection_made``
(calls ``on_connected``) -> chunks queue up and are taken by ``read`` ->
end of stream or reset (``connection_lost`` resolves ``lost``).
"""

from __future__ import annotations

import asyncio
import mmap
from collections import deque
from collections.abc import Callable


READ_BYTES = 4 << 20  # the most one loop iteration takes from the socket


class TcpStream(asyncio.BufferedProtocol):
    """Chunk queue and flow control of one TCP socket (see the module docstring).

    Made by a protocol factory, e.g.
    ``await loop.create_connection(lambda: TcpStream(4 << 20), sock=sock)``.
    """

    def __init__(self, recv_queue_bytes: int,
                 on_connected: Callable[[TcpStream], None] | None = None):
        self.transport: asyncio.Transport | None = None
        self._on_connected = on_connected
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._chunks: deque[bytes] = deque()
        self._queued, self._limit = 0, recv_queue_bytes
        self._ended, self._error = False, None
        self._reading_paused = self._writing_paused = False
        self._waiters: set[asyncio.Future[None]] = set()  # a reader and/or a drainer
        self._buffer: memoryview | None = None  # made at the first read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self._on_connected is not None:
            self._on_connected(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._buffer is None:  # pages exist once a read writes them (RSS: the largest read)
            self._buffer = memoryview(mmap.mmap(-1, READ_BYTES))
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self._buffer[:nbytes]))

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._queued += len(data)
        if self._queued > self._limit and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._ended = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended, self._error = True, exc
        if not self.lost.done():
            self.lost.set_result(None)
        self._wake()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake()

    async def read(self) -> bytes:
        """The oldest received chunk; b"" at end of stream; OSError if it was reset."""
        while not self._chunks:
            if self._ended:
                if self._error is not None:
                    raise ConnectionResetError(f"connection lost: {self._error}")
                return b""
            await self._wait()
        chunk = self._chunks.popleft()
        self._queued -= len(chunk)
        if self._reading_paused and self._queued <= self._limit // 2:
            self._reading_paused = False
            self.transport.resume_reading()
        return chunk

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark."""
        while self._writing_paused:
            if self.lost.done():
                raise ConnectionResetError("connection lost while sending")
            await self._wait()

    async def _wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            self._waiters.discard(waiter)

    def _wake(self) -> None:
        """Wake every waiter; each re-checks its own condition."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
