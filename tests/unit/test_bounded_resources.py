"""Bounded resources against broken or hostile peers (docs/pdd-roles.md, Bounded resources).

One test per limit: frame sizes by message type (checked on the header,
before anything is reserved), HELLO-only until a peer identifies itself,
the incomplete-frame and HELLO timeouts, the connection cap, REQUEST checks
against the model (vocabulary, context) and the per-role request cap, and
that the limits come from the role config. Frame-level tests are pure;
connection tests use loopback TCP (no root) or the in-memory fake.
"""

from __future__ import annotations

import asyncio
import struct
import tracemalloc
import zlib

import pytest

from testbed.errors import ProtocolError, SpecError
from testbed.pdd.run.config import frame_limit, kv_chunk_bounds
from testbed.pdd.wire.fake_transport import FakeNetwork
from testbed.pdd.wire.kvpayload import kv_chunk
from testbed.pdd.compute.model import ModelConfig, TinyDecoder
from testbed.pdd.run.node import tcp_options
from testbed.pdd.roles.peers import Peer, RoleServer, request_problem
from testbed.pdd.wire.protocol import (HEADER_SIZE, MAGIC, VERSION, Cancel, Error, ErrorCode, Frame,
                                  FrameDecoder, FrameLimits, Health, Hello, MsgType,
                                  Request, Role, Tokens, encode_frame)
from testbed.pdd.wire.transport import ConnectionClosed, TcpOptions, TcpTransport
from tests.unit.pdd_fixtures import small_config

_PREFIX = struct.Struct("!2sBBBQIII")


def header(msg_type: MsgType, length: int, filler: int = 0, rid: int = 1) -> bytes:
    """A valid header (both CRCs right) announcing ``length`` payload bytes."""
    prefix = _PREFIX.pack(MAGIC, VERSION, msg_type, 0, rid, length, filler, 0)
    return prefix + struct.pack("!I", zlib.crc32(prefix))


def run(coro, timeout_s: float = 20.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


# -- frame sizes by message type ----------------------------------------------------------

@pytest.mark.parametrize("msg_type", [MsgType.HELLO, MsgType.REQUEST, MsgType.TOKENS,
                                      MsgType.HANDOFF, MsgType.ERROR, MsgType.REPORT])
def test_a_control_frame_announcing_60_mb_is_refused_on_its_header(msg_type):
    dec = FrameDecoder()  # defaults: 64 MiB frames, 1 MiB control payloads
    with pytest.raises(ProtocolError, match=f"{msg_type.name} frame announces a 60000000-byte "
                                            "payload; at most 1048576 accepted"):
        dec.feed(header(msg_type, 60_000_000))


@pytest.mark.parametrize("msg_type, size", [(MsgType.HEALTH, 8), (MsgType.KV_DONE, 16),
                                            (MsgType.KV_NEED, 8), (MsgType.CANCEL, 0)])
def test_a_fixed_layout_frame_must_announce_exactly_its_size(msg_type, size):
    assert FrameLimits().payload_limit(msg_type) == size
    for wrong in (size + 1, 60_000_000) + ((size - 1,) if size else ()):
        with pytest.raises(ProtocolError, match=f"{wrong}-byte payload; its layout is "
                                                f"exactly {size} bytes"):
            FrameDecoder().feed(header(msg_type, wrong))
    dec = FrameDecoder()
    dec.feed(header(msg_type, size))  # accepted: waits for the payload (CANCEL has none)
    assert dec.error is None


def test_only_kv_chunk_may_be_large_and_its_real_bytes_have_their_own_bound():
    limits = FrameLimits(max_frame_bytes=64 << 20, max_bulk_payload_bytes=1 << 20)
    assert FrameDecoder(limits=limits).feed(header(MsgType.KV_CHUNK, 1 << 20, 50 << 20)) == []
    with pytest.raises(ProtocolError, match="KV_CHUNK frame announces a 1048577-byte"):
        FrameDecoder(limits=limits).feed(header(MsgType.KV_CHUNK, (1 << 20) + 1))
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes"):
        FrameDecoder(limits=limits).feed(header(MsgType.KV_CHUNK, 100, 64 << 20))


def test_a_header_announcing_a_large_payload_reserves_nothing_until_it_arrives():
    decoders = [FrameDecoder() for _ in range(50)]
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for dec in decoders:  # 50 connections, each announcing a 30 MB KV_CHUNK
            dec.feed(header(MsgType.KV_CHUNK, 30_000_000) + bytes(1000))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(d.buffered == HEADER_SIZE + 1000 for d in decoders)
    assert held - base < 1_000_000  # 1.5 GB announced; what arrived (50 KB) is what is held


def test_a_kv_chunk_still_decodes_when_its_payload_arrives_in_pieces():
    model = TinyDecoder(ModelConfig(d_model=64, n_layer=2, n_head=2))
    _, cache = model.prefill(list(range(40)))
    chunk, _ = kv_chunk(cache, 0, 40, modeled_bytes=200_000)
    data = encode_frame(Frame(5, chunk))
    dec, frames = FrameDecoder(), []
    for i in range(0, len(data), 7_777):
        frames += dec.feed(data[i: i + 7_777])
    assert len(frames) == 1 and bytes(frames[0].message.data) == bytes(chunk.data)


def test_before_hello_only_hello_is_accepted():
    limits = FrameLimits(first_types=frozenset({MsgType.HELLO}))
    with pytest.raises(ProtocolError, match=r"KV_CHUNK as the first frame \(expected HELLO\)"):
        FrameDecoder(limits=limits).feed(header(MsgType.KV_CHUNK, 1000))
    hello = encode_frame(Frame(0, Hello(Role.ROUTER, "r")))
    then = encode_frame(Frame(1, Request((1, 2), 3)))  # in the same chunk as the HELLO
    got = FrameDecoder(limits=limits).feed(hello + then)
    assert [f.msg_type for f in got] == [MsgType.HELLO, MsgType.REQUEST]


# -- the role config ------------------------------------------------------------------------

def test_limits_come_from_the_config_with_defaults():
    cfg = small_config()
    opts = tcp_options(cfg)
    assert (opts.max_frame_bytes, opts.max_bulk_payload_bytes, opts.max_control_payload_bytes,
            opts.frame_timeout_s, opts.max_connections) == (64 << 20, 32 << 20, 1 << 20, 60.0, 256)
    assert (cfg.limits.hello_timeout_s, cfg.limits.max_requests) == (10.0, 512)
    opts = tcp_options(small_config(limits={"frame_timeout_s": 0, "max_connections": 3}))
    assert (opts.frame_timeout_s, opts.max_connections) == (None, 3)
    # auto frame bound: twice the config's largest KV_CHUNK once that exceeds 32 MiB
    big = small_config(timing={"kv_scale_k": 1, "token_scale": 32})
    assert kv_chunk_bounds(big)[1] > 100e6 and frame_limit(big) == 2 * kv_chunk_bounds(big)[1]
    assert tcp_options(small_config(limits={"max_frame_bytes": 1 << 20})).max_frame_bytes == 1 << 20


def test_limits_too_small_for_the_configs_own_kv_chunks_are_a_config_error():
    cfg = small_config()
    real, frame = kv_chunk_bounds(cfg)
    model = TinyDecoder(cfg.model)
    _, cache = model.prefill([1] * cfg.prefill.kv_chunk_tokens)
    chunk, _ = kv_chunk(cache, 0, cfg.prefill.kv_chunk_tokens,
                        cfg.timing.modeled_kv_bytes(cfg.prefill.kv_chunk_tokens))
    assert chunk.payload_size() <= real < chunk.payload_size() + 100
    on_wire = HEADER_SIZE + chunk.payload_size() + chunk.filler
    assert on_wire <= frame < on_wire + 100
    with pytest.raises(SpecError, match="limits.max_kv_payload_bytes"):
        small_config(limits={"max_kv_payload_bytes": real - 1})
    with pytest.raises(SpecError, match="limits.max_frame_bytes"):
        small_config(limits={"max_frame_bytes": frame - 1})
    with pytest.raises(SpecError, match="limits.max_connections"):
        small_config(limits={"max_connections": 0})


# -- REQUEST checks -------------------------------------------------------------------------

@pytest.mark.parametrize("prompt, max_out, reason", [
    ((1, 2, 512), 4, "token id 512, outside the vocabulary of 512"),
    ((1,) * 65, 1, "prompt of 65 tokens exceeds the model's context of 64"),
    ((1,), 2**32 - 1, "max_output_tokens 4294967295 exceeds the model's context of 64"),
    ((1,) * 40, 25, r"prompt \+ max output \(40 \+ 25\) exceed the model's context of 64"),
])
def test_a_request_the_model_cannot_serve_has_a_reason(prompt, max_out, reason):
    model = ModelConfig(vocab_size=512, max_context=64)
    with pytest.raises(AssertionError, match=reason):
        assert request_problem(model, Request(prompt, max_out)) is None, \
            request_problem(model, Request(prompt, max_out))
    assert request_problem(model, Request((511,) * 40, 24)) is None


class EchoRole(RoleServer):
    """A role that records what reaches ``on_frame`` and holds every REQUEST it gets."""

    ROLE = Role.PREFILL

    def __init__(self, *args):
        super().__init__(*args)
        self.seen: list[Frame] = []

    def active_requests(self) -> int:
        return sum(isinstance(f.message, Request) for f in self.seen)

    async def on_frame(self, peer: Peer, frame: Frame) -> None:
        self.seen.append(frame)
        if isinstance(frame.message, Health):
            await peer.send(frame.request_id, Tokens(Role.PREFILL, 0, (1,)))


async def _echo_role(**limits):
    cfg = small_config(limits=limits)
    net = FakeNetwork()
    role = EchoRole(cfg, "p0", net.host("p0"))
    await role.start()
    return role, net.host("client")


async def _hello(conn):
    await conn.send(Frame(0, Hello(Role.ROUTER, "router")))


def test_a_bad_request_gets_error_with_its_reason_and_the_role_serves_on():
    async def go():
        role, client = await _echo_role(max_requests=2)
        conn = await client.connect("p0", 7001)
        await _hello(conn)
        await conn.send(Frame(1, Request((1, 9999), 4)))
        await conn.send(Frame(2, Request((1,) * 4000, 200)))
        await conn.send(Frame(3, Request((1, 2), 4)))
        await conn.send(Frame(4, Request((3,), 4)))
        await conn.send(Frame(5, Request((4,), 4)))  # a third while two are held
        got = [await conn.recv() for _ in range(3)]
        await conn.send(Frame(9, Health(1)))
        assert (await conn.recv()).request_id == 9  # still served on the same connection
        await role.stop()
        return role, got

    role, got = run(go())
    assert [(f.request_id, f.message.code) for f in got] == [
        (1, ErrorCode.PROTOCOL), (2, ErrorCode.PROTOCOL), (5, ErrorCode.OVERLOADED)]
    assert "token id 9999, outside the vocabulary of 512" in got[0].message.reason
    assert "exceed the model's context of 4096" in got[1].message.reason
    assert "2 requests held (limits.max_requests)" in got[2].message.reason
    assert [f.request_id for f in role.seen] == [3, 4, 9]
    assert role.rejected_requests == 3


def test_a_connection_that_sends_no_hello_is_closed_after_the_hello_timeout():
    async def go():
        role, client = await _echo_role(hello_timeout_s=0.2)
        idle = await client.connect("p0", 7001)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ConnectionClosed):
            await idle.recv()
        waited = loop.time() - t0
        ok = await client.connect("p0", 7001)  # the role serves on
        await _hello(ok)
        await ok.send(Frame(7, Health(1)))
        assert (await ok.recv()).request_id == 7
        await role.stop()
        return waited

    assert 0.15 < run(go()) < 2.0


def test_a_stranger_cannot_make_a_role_buffer_kv():
    async def go():
        role, client = await _echo_role()
        conn = await client.connect("p0", 7001)
        await conn.send_raw(header(MsgType.KV_CHUNK, 30_000_000))
        with pytest.raises(ConnectionClosed):
            await conn.recv()
        await role.stop()
        return role

    assert run(go()).seen == []


def test_stray_frames_are_counted_and_logged(caplog):
    role = EchoRole(small_config(), "p0", FakeNetwork().host("p0"))
    peer = Peer(None, Role.MAIN_DECODE, "md0", outbound=False)
    with caplog.at_level("WARNING", "testbed.pdd.roles.peers"):
        for rid in range(25):
            role.stray(peer, Frame(rid + 100, Cancel()))
    assert role.stray_frames == 25
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 20 and "dropped CANCEL for request 100 from md0" in warned[0]


# -- TCP: incomplete frames and the connection cap -------------------------------------------

def test_an_incomplete_frame_is_cut_off_after_the_frame_timeout():
    async def go():
        got: list = []

        async def handler(conn):
            try:
                got.append(await conn.recv())
            except ProtocolError as err:
                got.append(err)

        opts = TcpOptions(frame_timeout_s=0.3)
        listener = await TcpTransport(opts).serve("127.0.0.1", 0, handler)
        conn = await TcpTransport().connect(*listener.address)
        data = encode_frame(Frame(1, Error(ErrorCode.INTERNAL, "x" * 100)))
        await conn.send_raw(data[:50])  # half a frame, then silence
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while not got:
            await asyncio.sleep(0.02)
        waited = loop.time() - t0
        conn.close()
        listener.close()
        await listener.wait_closed()
        return got[0], waited

    err, waited = run(go())
    assert isinstance(err, ProtocolError) and "not in 0.3 s (frame_timeout_s)" in str(err)
    assert 0.25 < waited < 2.0


def test_time_outside_recv_does_not_count_against_the_frame_timeout():
    async def go():
        opts = TcpOptions(frame_timeout_s=0.3)
        frames: list = []

        async def handler(conn):
            frames.append(await conn.recv())
            await asyncio.sleep(0.5)  # a slow handler, while the next frame's start waits
            frames.append(await conn.recv())

        listener = await TcpTransport(opts).serve("127.0.0.1", 0, handler)
        conn = await TcpTransport().connect(*listener.address)
        a = encode_frame(Frame(1, Health(1)))
        b = encode_frame(Frame(2, Health(2)))
        await conn.send_raw(a + b[:10])
        await asyncio.sleep(0.1)
        await conn.send_raw(b[10:])
        while len(frames) < 2:
            await asyncio.sleep(0.02)
        conn.close()
        listener.close()
        await listener.wait_closed()
        return frames

    assert [f.request_id for f in run(go())] == [1, 2]


async def _admission_listener(**caps):
    """A TCP listener echoing frames; a connection's first frame says who it is, as a
    role's HELLO would: request id 1 a configured instance (member), 2 a guest, anything
    else nothing (it stays pending)."""
    box = {}

    async def echo(conn):
        first = await conn.recv()
        if first.request_id in (1, 2):
            why = box["listener"].identified(conn, member=first.request_id == 1)
            if why is not None:
                raise ConnectionClosed(why)
        await conn.send(first)
        while True:
            await conn.send(await conn.recv())

    box["listener"] = await TcpTransport(TcpOptions(**caps)).serve("127.0.0.1", 0, echo)
    return box["listener"]


async def _alive(conn, rid: int) -> bool:
    try:
        await conn.send(Frame(rid, Health(rid)))
        return (await asyncio.wait_for(conn.recv(), 2.0)).request_id == rid
    except (ConnectionClosed, ProtocolError):
        return False


def test_a_connection_beyond_the_cap_closes_the_oldest_that_said_nothing():
    async def go():
        listener = await _admission_listener(max_connections=3)
        client = TcpTransport()
        conns = []
        for _ in range(5):
            conns.append(await client.connect(*listener.address))
            await asyncio.sleep(0.05)  # accepted in this order
        alive = [await _alive(c, 7) for c in conns]
        evicted, refused = listener.evicted, listener.refused
        for conn in conns:
            conn.close()
        await asyncio.sleep(0.1)
        again = await client.connect(*listener.address)  # freed slots are used again
        alive.append(await _alive(again, 9))
        again.close()
        listener.close()
        await listener.wait_closed()
        return alive, evicted, refused

    alive, evicted, refused = run(go())
    assert alive == [False, False, True, True, True, True] and (evicted, refused) == (2, 0)


def test_a_connection_is_refused_only_when_every_open_one_said_who_it_is():
    async def go():
        listener = await _admission_listener(max_connections=3)
        client = TcpTransport()
        members = [await client.connect(*listener.address) for _ in range(3)]
        said = [await _alive(c, 1) for c in members]
        late = await client.connect(*listener.address)
        await asyncio.sleep(0.1)
        alive = [await _alive(c, 5) for c in [*members, late]]
        for conn in [*members, late]:
            conn.close()
        listener.close()
        await listener.wait_closed()
        return said, alive, listener.refused

    said, alive, refused = run(go())
    assert said == [True] * 3 and alive == [True, True, True, False] and refused == 1


def test_strangers_cannot_take_the_room_kept_for_configured_instances():
    """max_connections 8, of which strangers 3: 6 connections that never say who they
    are leave 3 open; 3 guests then push those out, a 4th guest is closed at its HELLO;
    members still get in beside them."""
    async def go():
        listener = await _admission_listener(max_connections=8, max_strangers=3)
        client = TcpTransport()
        silent = []
        for _ in range(6):
            silent.append(await client.connect(*listener.address))
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        pending_after_flood = len(listener.pending)
        guests, guest_ok, members, member_ok = [], [], [], []
        for _ in range(4):  # each says HELLO before the next connects
            guests.append(await client.connect(*listener.address))
            guest_ok.append(await _alive(guests[-1], 2))
        for _ in range(4):
            members.append(await client.connect(*listener.address))
            member_ok.append(await _alive(members[-1], 1))
        counts = (pending_after_flood, len(listener.pending), len(listener.guests),
                  listener.guests_refused)
        for conn in [*silent, *guests, *members]:
            conn.close()
        listener.close()
        await listener.wait_closed()
        return guest_ok, member_ok, counts

    guest_ok, member_ok, counts = run(go())
    assert guest_ok == [True, True, True, False] and member_ok == [True] * 4
    assert counts == (3, 0, 3, 1)


def test_one_address_may_hold_only_its_share_of_connections_without_hello():
    async def go():
        listener = await _admission_listener(max_connections=64, max_per_address=2)
        client = TcpTransport()
        conns = []
        for _ in range(4):
            conns.append(await client.connect(*listener.address))
            await asyncio.sleep(0.05)
        alive = [await _alive(c, 7) for c in conns]
        for conn in conns:
            conn.close()
        listener.close()
        await listener.wait_closed()
        return alive, listener.evicted

    assert run(go()) == ([False, False, True, True], 2)


def test_only_the_configured_router_becomes_the_roles_router_and_a_lost_one_falls_back():
    async def go():
        role, client = await _echo_role()
        seen = []

        async def greet(name):
            conn = await client.connect("p0", 7001)
            await conn.send(Frame(0, Hello(Role.ROUTER, name)))
            await conn.send(Frame(1, Health(1)))
            await conn.recv()  # the role has taken the HELLO
            return conn

        evil = await greet("evil")
        seen.append(role.router)
        first = await greet("router")
        seen.append(role.router.conn.peer if role.router else None)
        second = await greet("router")  # e.g. a restarted router
        newest = role.router
        second.close()
        await asyncio.sleep(0.05)
        fallback = role.router
        for conn in (evil, first):
            conn.close()
        await asyncio.sleep(0.05)
        seen.append(role.router)
        await role.stop()
        return seen, newest, fallback

    seen, newest, fallback = run(go())
    assert seen[0] is None and seen[1] is not None and seen[2] is None
    assert newest is not fallback and fallback is not None and fallback.name == "router"
