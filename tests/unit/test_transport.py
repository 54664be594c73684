"""PDD transport: TCP on loopback (127.0.0.1, port 0) and the in-memory fake, same tests.

Every test that takes ``make_backend`` runs once per backend; ``test_fake_matches_tcp``
also checks that both produce the same transcript for the same exchange.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass

import pytest

from testbed.errors import ProtocolError
from testbed.pdd.wire.fake_transport import FakeNetwork
from testbed.pdd.wire.protocol import (
    MAX_FRAME_BYTES,
    Done,
    FinishReason,
    Frame,
    Health,
    HealthAck,
    Hello,
    KvChunk,
    Request,
    Role,
    Tokens,
    encode_frame,
)
from testbed.pdd.wire.transport import (
    ConnectionClosed,
    TcpOptions,
    TcpTransport,
    Transport,
    connect,
    serve,
)


@dataclass
class Backend:
    server: Transport
    client: Transport
    host: str  # where the server binds


def _backend(kind: str, max_frame_bytes: int = MAX_FRAME_BYTES, delay_s: float = 0.0) -> Backend:
    if kind == "tcp":
        options = TcpOptions(max_frame_bytes=max_frame_bytes, sndbuf_bytes=1 << 20,
                             rcvbuf_bytes=1 << 20)
        return Backend(TcpTransport(options), TcpTransport(options), "127.0.0.1")
    net = FakeNetwork(delay_s=delay_s, max_frame_bytes=max_frame_bytes)
    return Backend(net.host("srv"), net.host("cli"), "srv")


@pytest.fixture(params=["tcp", "fake"])
def make_backend(request):
    return lambda **kw: _backend(request.param, **kw)


def run(coro, timeout_s: float = 10.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def serve_requests(conn) -> None:
    """A toy server: answers HEALTH, and each REQUEST with its prompt reversed, then DONE."""
    while True:
        frame = await conn.recv()
        msg = frame.message
        if isinstance(msg, Health):
            await conn.send(Frame(0, HealthAck(msg.nonce, 1, 0)))
        elif isinstance(msg, Request):
            out = tuple(reversed(msg.prompt_token_ids))[: msg.max_output_tokens]
            await conn.send(Frame(frame.request_id, Tokens(Role.MAIN_DECODE, 0, out)))
            await conn.send(Frame(frame.request_id, Done(len(out), FinishReason.LENGTH)))


async def ask(conn, request_id: int, prompt: tuple[int, ...]) -> list[Frame]:
    await conn.send(Frame(request_id, Request(prompt, 8)))
    return [await conn.recv(), await conn.recv()]


async def malformed_then_good_exchange(backend: Backend) -> dict:
    """Client A sends a malformed frame; B, connected before and after, is still served."""
    async with await backend.server.serve(backend.host, 0, serve_requests) as listener:
        b = await backend.client.connect(*listener.address)
        a = await backend.client.connect(*listener.address)
        await a.send(Frame(0, Hello(Role.CLIENT, "a")))
        await a.send_raw(b"XX" + bytes(40))  # bad magic
        with pytest.raises(ConnectionClosed):
            await a.recv()
        first = await ask(b, 1, (1, 2, 3))
        c = await backend.client.connect(*listener.address)
        await c.send(Frame(0, Health(nonce=9)))
        health = await c.recv()
        second = await ask(b, 2, (4, 5))
        counters = (a.bytes_sent, b.bytes_sent, b.bytes_received, c.bytes_received)
        for conn in (a, b, c):
            conn.close()
    return {"frames": first + [health] + second, "counters": counters}


def test_server_drops_a_malformed_client_and_keeps_serving(make_backend, caplog):
    caplog.set_level(logging.WARNING, logger="testbed.pdd.wire.transport")
    result = run(malformed_then_good_exchange(make_backend()))
    assert [f.message for f in result["frames"]] == [
        Tokens(Role.MAIN_DECODE, 0, (3, 2, 1)), Done(3, FinishReason.LENGTH),
        HealthAck(9, 1, 0),
        Tokens(Role.MAIN_DECODE, 0, (5, 4)), Done(2, FinishReason.LENGTH)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "protocol error" in warnings[0] and "bad magic b'XX'" in warnings[0]


def test_fake_matches_tcp():
    tcp = run(malformed_then_good_exchange(_backend("tcp")))
    fake = run(malformed_then_good_exchange(_backend("fake")))
    assert tcp == fake


def test_oversized_frame_closes_only_that_connection(make_backend, caplog):
    caplog.set_level(logging.WARNING, logger="testbed.pdd.wire.transport")

    async def scenario():
        backend = make_backend(max_frame_bytes=4096)
        async with await backend.server.serve(backend.host, 0, serve_requests) as listener:
            big = await backend.client.connect(*listener.address)
            good = await backend.client.connect(*listener.address)
            huge = encode_frame(Frame(5, KvChunk(0, 1, 0, 1, bytes(10_000))))
            with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=4096"):
                await big.send(Frame(5, KvChunk(0, 1, 0, 1, bytes(10_000))))
            await big.send_raw(huge)  # bypass the local check: the server must refuse it
            with pytest.raises(ConnectionClosed):
                await big.recv()
            async with big, good:
                return await ask(good, 1, (7, 8))

    frames = run(scenario())
    assert frames[0].message.token_ids == (8, 7)
    assert any("exceeds max_frame_bytes=4096" in r.getMessage() for r in caplog.records)


def test_byte_counters_match_on_both_ends(make_backend):
    async def scenario():
        backend, server_side = make_backend(), []

        async def handler(conn):
            server_side.append(conn)
            await serve_requests(conn)

        async with await backend.server.serve(backend.host, 0, handler) as listener:
            conn = await backend.client.connect(*listener.address)
            await ask(conn, 1, tuple(range(1000)))
            srv = server_side[0]
            expected = len(encode_frame(Frame(1, Request(tuple(range(1000)), 8))))
            assert conn.bytes_sent == srv.bytes_received == expected
            assert conn.bytes_received == srv.bytes_sent
            assert (conn.frames_sent, conn.frames_received) == (1, 2)
            conn.close()

    run(scenario())


def test_peer_close_and_mid_frame_close(make_backend):
    async def scenario():
        backend, outcomes = make_backend(), {}

        async def handler(conn):
            first = await conn.recv()
            try:
                await conn.recv()
            except (ConnectionClosed, ProtocolError) as err:
                outcomes[first.request_id] = type(err)
                raise

        async with await backend.server.serve(backend.host, 0, handler) as listener:
            clean = await backend.client.connect(*listener.address)
            await clean.send(Frame(1, Health(1)))
            clean.close()
            with pytest.raises(ConnectionClosed):
                await clean.send(Frame(1, Health(2)))
            cut = await backend.client.connect(*listener.address)
            await cut.send(Frame(2, Health(3)))
            await cut.send_raw(encode_frame(Frame(2, Health(4)))[:10])
            cut.close()
            while len(outcomes) < 2:
                await asyncio.sleep(0.01)
        return outcomes

    assert run(scenario()) == {1: ConnectionClosed, 2: ProtocolError}


def test_concurrent_senders_never_interleave_frames(make_backend):
    async def scenario():
        backend, got = make_backend(), []

        async def handler(conn):
            while len(got) < 40:
                got.append(await conn.recv())

        async with await backend.server.serve(backend.host, 0, handler) as listener:
            conn = await backend.client.connect(*listener.address)

            async def sender(rid):
                for i in range(10):
                    await conn.send(Frame(rid, KvChunk(0, 1, i, i + 1, bytes([rid]) * 200_000)))

            await asyncio.gather(*(sender(rid) for rid in range(4)))
            while len(got) < 40:
                await asyncio.sleep(0.01)
            conn.close()
        return got

    got = run(scenario())
    for rid in range(4):
        mine = [f.message for f in got if f.request_id == rid]
        assert [m.token_start for m in mine] == list(range(10))
        assert all(m.data == bytes([rid]) * 200_000 for m in mine)


def test_handler_bug_is_logged_and_other_connections_continue(make_backend, caplog):
    async def scenario():
        backend = make_backend()

        async def handler(conn):
            frame = await conn.recv()
            if frame.request_id == 666:
                raise RuntimeError("bug in role")
            await serve_requests(conn)

        async with await backend.server.serve(backend.host, 0, handler) as listener:
            bad = await backend.client.connect(*listener.address)
            await bad.send(Frame(666, Health(1)))
            with pytest.raises(ConnectionClosed):
                await bad.recv()
            async with bad, await backend.client.connect(*listener.address) as good:
                await good.send(Frame(1, Health(1)))
                return await ask(good, 2, (1,))

    assert run(scenario())[1].message == Done(1, FinishReason.LENGTH)
    assert any("handler failed" in r.getMessage() and r.exc_info for r in caplog.records)


def test_listener_close_ends_live_connections(make_backend):
    async def scenario():
        backend = make_backend()
        listener = await backend.server.serve(backend.host, 0, serve_requests)
        conn = await backend.client.connect(*listener.address)
        await ask(conn, 1, (1,))
        listener.close()
        await listener.wait_closed()
        with pytest.raises(ConnectionClosed):
            await conn.recv()
        conn.close()
        with pytest.raises(OSError):
            await backend.client.connect(*listener.address)

    run(scenario())


def test_fake_delay_applies_per_direction_and_keeps_order():
    async def scenario():
        net = FakeNetwork()
        net.set_delay("cli", "srv", 0.05)
        net.set_delay("srv", "cli", 0.02)
        listener = await net.host("srv").serve("srv", 0, serve_requests)
        t0 = time.monotonic()
        conn = await net.host("cli").connect(*listener.address)
        connect_s = time.monotonic() - t0
        t0 = time.monotonic()
        answers = [await ask(conn, rid, (rid + 1,)) for rid in range(3)]
        rtt_s = (time.monotonic() - t0) / 3
        conn.close()
        listener.close()
        return connect_s, rtt_s, answers

    connect_s, rtt_s, answers = run(scenario())
    # both directions' delays apply (a lower bound: a loaded machine only adds time;
    # how close the fake comes to its delays is not a unit test's business)
    assert connect_s >= 0.07 and rtt_s >= 0.07
    assert [a[0].message.token_ids for a in answers] == [(1,), (2,), (3,)]


def test_fake_refuses_unknown_and_foreign_addresses():
    async def scenario():
        net = FakeNetwork()
        with pytest.raises(ConnectionRefusedError):
            await net.host("cli").connect("srv", 1234)
        with pytest.raises(OSError, match="cannot bind"):
            await net.host("cli").serve("srv", 0, serve_requests)
        listener = await net.host("srv").serve("0.0.0.0", 7000, serve_requests)
        assert listener.address == ("srv", 7000)
        with pytest.raises(OSError, match="in use"):
            await net.host("srv").serve("srv", 7000, serve_requests)

    run(scenario())


def test_tcp_options_reach_the_socket():
    async def scenario():
        options = TcpOptions(sndbuf_bytes=256 * 1024, rcvbuf_bytes=512 * 1024)
        async with await serve("127.0.0.1", 0, serve_requests, options) as listener:
            async with await connect(*listener.address, options) as conn:
                sock = conn.sock
                return (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
                        sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                        sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))

    nodelay, sndbuf, rcvbuf = run(scenario())
    assert nodelay == 1
    assert sndbuf >= 256 * 1024 and rcvbuf >= 512 * 1024  # Linux reports twice the request


def test_tcp_sender_blocks_while_the_receiver_does_not_read():
    """Flow control end to end: a slow reader pauses its socket, and the sender's send waits."""
    async def scenario():
        options = TcpOptions(sndbuf_bytes=128 * 1024, rcvbuf_bytes=128 * 1024,
                             recv_queue_bytes=1 << 20)
        reading, got = asyncio.Event(), []

        async def slow_reader(conn):
            await reading.wait()
            while len(got) < 64:
                got.append(await conn.recv())

        async with await serve("127.0.0.1", 0, slow_reader, options) as listener:
            async with await connect(*listener.address, options) as conn:
                chunk = KvChunk(0, 1, 0, 1, bytes(1 << 20))
                sending = asyncio.ensure_future(
                    asyncio.gather(*(conn.send(Frame(i, chunk)) for i in range(64))))
                await asyncio.sleep(0.5)
                blocked = not sending.done()
                reading.set()
                await sending
                while len(got) < 64:
                    await asyncio.sleep(0.01)
        return blocked, sorted(f.request_id for f in got)

    blocked, ids = run(scenario())
    assert blocked
    assert ids == list(range(64))


def test_kv_chunks_with_filler_arrive_whole_and_are_counted(make_backend):
    """Real bytes and several MB of filler per frame, interleaved with small frames."""
    async def scenario():
        backend, got, server_side = make_backend(), [], []

        async def handler(conn):
            server_side.append(conn)
            while True:
                got.append(await conn.recv())

        sent = [Frame(i, KvChunk(0, 4, 64 * i, 64 * i + 64, bytes([i]) * 5000,
                                 filler=(3 << 20) + i)) for i in range(1, 4)]
        sent.insert(1, Frame(9, Tokens(Role.RELAY_DECODE, 0, (1, 2))))
        async with await backend.server.serve(backend.host, 0, handler) as listener:
            conn = await backend.client.connect(*listener.address)
            for frame in sent:
                await conn.send(frame)
            while len(got) < len(sent):
                await asyncio.sleep(0.01)
            assert got == sent
            expected = sum(len(encode_frame(f)) for f in sent)
            assert conn.bytes_sent == server_side[0].bytes_received == expected
            conn.close()

    run(scenario())


def test_tcp_stream_takes_more_than_asyncio_s_256_kib_per_loop_pass():
    """A loop blocked by compute (a decode step) takes all the kernel holds at its next
    pass, up to READ_BYTES: asyncio's plain Protocol takes at most 256 KiB, which capped
    MD's KV reception at 256 KiB per decode step (docs/pdd-roles.md, Known gaps)."""
    from testbed.pdd.wire.tcp_stream import READ_BYTES, TcpStream

    async def scenario():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        _, stream = await loop.connect_accepted_socket(lambda: TcpStream(16 << 20), b)
        a.setblocking(False)
        sent = 0
        try:
            while sent < 2 << 20:
                sent += a.send(bytes(64 << 10))
        except BlockingIOError:
            pass
        time.sleep(0.2)  # the loop is blocked, as by a decode step; the kernel holds `sent`
        first = await stream.read()
        a.close()
        stream.transport.close()
        return sent, len(first)

    sent, first = run(scenario())
    assert sent > 1 << 20, sent  # the kernel held over 1 MiB before the loop looked
    assert (256 << 10) < first <= READ_BYTES and first == min(sent, READ_BYTES)


def test_small_frames_of_one_loop_turn_go_in_one_write_and_keep_their_order():
    """A decode step's TOKENS frames (one per request) leave in one write at the end of the
    loop turn; a large frame between them flushes what was queued before it first."""
    async def scenario():
        got, writes = [], []

        async def handler(conn):
            while True:
                got.append(await conn.recv())

        options = TcpOptions()
        async with await serve("127.0.0.1", 0, handler, options) as listener:
            async with await connect(*listener.address, options) as conn:
                real_write = conn._transport.write
                conn._transport.write = lambda data: (writes.append(len(data)),
                                                      real_write(data))[1]
                small = [Frame(i, Tokens(Role.MAIN_DECODE, i, (i,))) for i in range(1, 9)]
                big = Frame(50, KvChunk(0, 1, 0, 1, bytes(200_000)))
                for f in small[:4]:
                    await conn.send(f)
                assert writes == []  # queued: nothing yielded to the loop yet
                await conn.send(big)
                for f in small[4:]:
                    await conn.send(f)
                await asyncio.sleep(0)
                n_writes = len(writes)
                while len(got) < 9:
                    await asyncio.sleep(0.01)
        return got, small, big, n_writes

    got, small, big, n_writes = run(scenario())
    assert got == small[:4] + [big] + small[4:]
    # the first four in one write, the large frame's own write(s), the last four in one
    assert n_writes <= 4


def test_a_queued_small_frame_does_not_change_when_its_buffer_is_reused():
    async def scenario():
        got = []

        async def handler(conn):
            while True:
                got.append(await conn.recv())

        options = TcpOptions()
        frame = Frame(3, Tokens(Role.MAIN_DECODE, 0, (7, 8)))
        wire = bytearray(encode_frame(frame))
        async with await serve("127.0.0.1", 0, handler, options) as listener:
            async with await connect(*listener.address, options) as conn:
                await conn._send([wire], 0)  # queued until the loop turns
                wire[:] = bytes(len(wire))    # the owner reuses its buffer at once
                while not got:
                    await asyncio.sleep(0.01)
        return got, frame

    got, frame = run(scenario())
    assert got == [frame]
