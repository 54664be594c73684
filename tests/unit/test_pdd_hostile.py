"""Hostile and broken peers against live role processes on loopback (no root).

One cluster (router, P, RLD, MD, each ``python -m testbed.pdd.run.node``) for the
module; each test is one kind of abuse, aimed at every role, at the sizes
given in its docstring. After each: every role process is alive, its
resident memory (VmRSS) stays under ``RSS_BOUND`` and an honest request
completes with exact tokens (``verify_records``). The limits under test
(docs/pdd-roles.md, Bounded resources) are set short here so the timeouts
show within the test: hello_timeout_s and frame_timeout_s 1 s,
max_connections 64.

RSS bound: each role's VmRSS after an honest warm-up request, plus
``RSS_SLACK`` (40 MB). Why that much: an honest request of this config
holds at most a 4096-token cache (2 KB per token: 8 MB) and the allocator
keeps some of what it frees; the abuses announce far more (e.g. 20
connections x 30 MB of KV payload = 600 MB per role), so a role that
reserved what headers announce, or buffered strangers' bytes, would be
caught by a wide margin.
"""

from __future__ import annotations

import asyncio
import os
import random
import select
import selectors
import socket
import struct
import threading
import time
import zlib

import pytest
from pdd_fixtures import small_config

from testbed.pdd.roles.client import Client
from testbed.pdd.roles.client_record import ClientRequest
from testbed.pdd.run.procs import RoleProcesses, loopback_config
from testbed.pdd.wire.protocol import (MAGIC, VERSION, Error, ErrorCode, Frame, FrameDecoder, Handoff,
                                  HandoffAck, Hello, KvDone, KvNeed, MsgType, Request, Role,
                                  Tokens, encode_frame)
from testbed.pdd.wire.transport import TcpTransport
from testbed.pdd.run.verify import verify_records

ROLES = ("router", "p0", "rld0", "md0")
RSS_SLACK = 40 << 20
# what each role's abuser says it is: the router takes REQUESTs from clients, P from a
# router (a name that is not the router's, so it never becomes P's router), RLD and MD
# from P
AS = {"router": (Role.CLIENT, "evil-client"), "p0": (Role.ROUTER, "evil-router"),
      "rld0": (Role.PREFILL, "evil-p"), "md0": (Role.PREFILL, "evil-p")}
_PREFIX = struct.Struct("!2sBBBQIII")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cfg = loopback_config(small_config(
        "pdd", timing={"connect_timeout_s": 20.0},
        limits={"hello_timeout_s": 1.0, "frame_timeout_s": 1.0, "max_connections": 64}))
    with RoleProcesses(cfg, tmp_path_factory.mktemp("pdd-hostile")) as procs:
        procs.start()
        honest(procs)  # warm: every role has served once before the baseline
        procs.rss_bound = {name: rss(procs, name) + RSS_SLACK for name in ROLES}
        yield procs


def rss(procs, name: str) -> int:
    """VmRSS of a role's process, bytes (/proc/PID/status)."""
    for line in open(f"/proc/{procs.procs[name].pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {name}")


_honest_ids = iter(range(1, 10_000))


def honest(procs) -> list[dict]:
    """One honest request, in this process over TCP; its tokens must be exact."""
    rng = random.Random(next(_honest_ids))
    req = ClientRequest(0, 0.0, tuple(rng.randrange(512) for _ in range(48)), 24, "honest")
    records = asyncio.run(asyncio.wait_for(
        Client(procs.cfg, TcpTransport(), "client").run([req]), 60))
    assert [r["status"] for r in records] == ["completed"], records[0].get("reason")
    assert all(v.match for v in verify_records(records, procs.cfg.model))
    return records


def after_abuse(procs) -> None:
    """Every role alive, under its RSS bound, and an honest request completes exactly."""
    for name in ROLES:
        assert procs.procs[name].poll() is None, f"{name} died"
        assert rss(procs, name) < procs.rss_bound[name], (name, rss(procs, name))
    print("RSS MB now / bound:", {n: (rss(procs, n) >> 20, procs.rss_bound[n] >> 20)
                                  for n in ROLES})
    honest(procs)
    for name in ROLES:
        assert procs.procs[name].poll() is None, f"{name} died"


def addr(procs, name: str) -> tuple[str, int]:
    inst = procs.cfg.instance(name)
    return inst.host, inst.port


def hello(name: str) -> bytes:
    role, who = AS[name]
    return encode_frame(Frame(0, Hello(role, who)))


def header(msg_type: MsgType, length: int, filler: int = 0, rid: int = 1) -> bytes:
    prefix = _PREFIX.pack(MAGIC, VERSION, msg_type, 0, rid, length, filler, 0)
    return prefix + struct.pack("!I", zlib.crc32(prefix))


def closed_by_peer(sock: socket.socket, timeout_s: float) -> bool:
    """True once the role has closed ``sock`` (EOF or reset) within ``timeout_s``."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def frames(sock: socket.socket, n: int, timeout_s: float = 10.0) -> list[Frame]:
    """The next ``n`` frames the role sends on ``sock``."""
    dec, got = FrameDecoder(), []
    sock.settimeout(timeout_s)
    while len(got) < n:
        data = sock.recv(65536)
        if not data:
            break
        got += dec.feed(data)
    return got


def test_garbage_bytes_close_only_their_connection(cluster):
    """Per role: 20 connections, each 64 KB of random bytes (half after a valid HELLO)."""
    rng = random.Random(1)
    for name in ROLES:
        for i in range(20):
            with socket.create_connection(addr(cluster, name), timeout=10) as s:
                s.sendall((hello(name) if i % 2 else b"") + rng.randbytes(65536))
                assert closed_by_peer(s, 5.0)
    after_abuse(cluster)


def test_stray_frames_for_unknown_requests_are_dropped_and_logged(cluster):
    """Per role: 100 well-formed frames about request ids nobody handed out."""
    stray = {"router": Tokens(Role.PREFILL, 0, (1,)), "p0": KvNeed(0, 16),
             "rld0": HandoffAck(1, 5), "md0": KvDone(16, 100, 1)}
    as_peer = {"router": (Role.PREFILL, "evil-p"), "p0": (Role.MAIN_DECODE, "evil-md"),
               "rld0": (Role.MAIN_DECODE, "evil-md"), "md0": (Role.PREFILL, "evil-p")}
    for name in ROLES:
        with socket.create_connection(addr(cluster, name), timeout=10) as s:
            s.sendall(encode_frame(Frame(0, Hello(*as_peer[name]))) + b"".join(
                encode_frame(Frame(10**12 + i, stray[name])) for i in range(100)))
            if name == "p0":  # P answers a KV_NEED it cannot serve with CANCEL
                assert {f.msg_type for f in frames(s, 100)} == {MsgType.CANCEL}
            time.sleep(0.3)
    time.sleep(0.5)
    for name in ROLES:
        text = (cluster.run_dir / f"{name}.log").read_text()
        assert f"dropped {stray[name].MSG_TYPE.name} for request {10**12}" in text, name
    after_abuse(cluster)


IMPOSSIBLE = [  # (prompt, max_out, the reason the ERROR must give)
    ((10**6,), 4, "token id 1000000, outside the vocabulary of 512"),
    ((1, 512), 4, "token id 512, outside the vocabulary of 512"),
    ((1,), 2**32 - 1, "max_output_tokens 4294967295 exceeds the model's context of 4096"),
    ((1,) * 4097, 4, "prompt of 4097 tokens exceeds the model's context of 4096"),
    ((1,) * 4000, 200, "prompt + max output (4000 + 200) exceed"),
    ((7,) * 250_000, 4, "prompt of 250000 tokens exceeds"),  # 1 MB: just under the bound
]


def test_impossible_requests_get_error_with_the_reason(cluster):
    """Per role, on one connection: REQUESTs with token ids 10^6 and 512 (vocabulary 512),
    max_output_tokens 2^32-1, prompts of 4097 and 250,000 tokens, 4000 + 200 tokens
    (context 4096); each gets ERROR(PROTOCOL) naming the reason, in order."""
    for name in ROLES:
        with socket.create_connection(addr(cluster, name), timeout=10) as s:
            s.sendall(hello(name) + b"".join(encode_frame(Frame(70 + i, Request(p, n)))
                                             for i, (p, n, _) in enumerate(IMPOSSIBLE)))
            per = 2 if name == "router" else 1  # the router: REPORT, then ERROR
            got = [f for f in frames(s, per * len(IMPOSSIBLE)) if isinstance(f.message, Error)]
            assert [f.request_id for f in got] == [70 + i for i in range(len(IMPOSSIBLE))], name
            for f, (_, _, reason) in zip(got, IMPOSSIBLE):
                assert f.message.code == ErrorCode.PROTOCOL and reason in f.message.reason, \
                    (name, f.message.reason)
    after_abuse(cluster)


def test_a_prompt_beyond_the_frame_bound_is_refused_on_the_header(cluster):
    """Per role: a REQUEST of 1,000,000 token ids (4 MB payload, over the 1 MiB bound)."""
    frame = encode_frame(Frame(5, Request((3,) * 1_000_000, 4)))
    for name in ROLES:
        with socket.create_connection(addr(cluster, name), timeout=10) as s:
            s.sendall(hello(name) + frame[:4096])
            assert closed_by_peer(s, 5.0)
    after_abuse(cluster)


def test_half_open_and_idle_connections_are_closed_by_the_timeouts(cluster):
    """Per role: 10 idle connections (nothing sent), 10 that send half a HELLO, 10 a HELLO
    and half a frame, 10 a HELLO and then shut their sending side (half-closed): all
    closed by the role within hello_timeout_s / frame_timeout_s (1 s) + 2 s."""
    half_hello = hello("router")[:10]
    half_frame = encode_frame(Frame(3, Handoff(1, 0, (1, 2, 3), False)))[:20]
    socks = []
    for name in ROLES:
        for kind in range(4):
            for _ in range(10):
                s = socket.create_connection(addr(cluster, name), timeout=10)
                if kind == 1:
                    s.sendall(half_hello)
                elif kind == 2:
                    s.sendall(hello(name) + half_frame)
                elif kind == 3:
                    s.sendall(hello(name))
                    s.shutdown(socket.SHUT_WR)
                socks.append((name, kind, s))
    t0 = time.monotonic()
    try:
        still_open = [(name, kind) for name, kind, s in socks
                      if not closed_by_peer(s, max(0.1, t0 + 3.0 - time.monotonic()))]
    finally:
        for _, _, s in socks:
            s.close()
    assert still_open == []
    after_abuse(cluster)


def test_connection_churn(cluster):
    """Per role: 200 connections opened and closed at once, 100 of them after a HELLO;
    then 100 held open against max_connections 64 without HELLO: the role closes the
    oldest to make room (32 per address), the newest stay open."""
    for name in ROLES:
        for i in range(200):
            with socket.create_connection(addr(cluster, name), timeout=10) as s:
                if i % 2:
                    s.sendall(hello(name))
    name = "md0"
    socks = []
    for _ in range(100):
        socks.append(socket.create_connection(addr(cluster, name), timeout=10))
        time.sleep(0.002)
    time.sleep(0.3)  # within hello_timeout_s (1 s): what is closed now was evicted
    closed = select.select(socks, [], [], 0)[0]  # readable: EOF or reset from the role
    for s in socks:
        s.close()
    # none said HELLO: beyond its address's share the oldest ones are closed for new ones
    assert len(closed) >= 100 - 32 and not set(closed) & set(socks[-10:])
    time.sleep(0.3)
    assert "before its HELLO to make room" in (cluster.run_dir / f"{name}.log").read_text()
    after_abuse(cluster)


class HalfOpenFlood:
    """``n`` connections to ``address``, each sends two bytes and then nothing; one the
    role closes is opened again at once, so ``n`` are held against the role for as long
    as the flood runs (a thread; ``with`` starts and stops it)."""

    def __init__(self, address: tuple[str, int], n: int = 300):
        self.address, self.n = address, n
        self.opened = 0  # connections made, first ones and re-opened ones
        self.closed_by_role = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, sel: selectors.BaseSelector) -> None:
        s = socket.create_connection(self.address, timeout=5)
        s.sendall(MAGIC)  # two bytes of a header, never the rest
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        self.opened += 1

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            for _ in range(self.n):
                self._open(sel)
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.05):
                    sock = key.fileobj
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if data:
                        continue
                    sel.unregister(sock)
                    sock.close()
                    self.closed_by_role += 1
                    if not self._stop.is_set():
                        self._open(sel)
            for key in list(sel.get_map().values()):
                key.fileobj.close()

    def __enter__(self) -> "HalfOpenFlood":
        self._thread.start()
        deadline = time.monotonic() + 30
        while self.opened < self.n and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.mark.parametrize("name", ROLES)
def test_honest_work_completes_while_300_half_open_connections_are_held(cluster, name):
    """300 connections, each having sent two bytes, held against one role (each one the
    role closes is opened again at once); an honest workload of 6 requests started
    during the attack completes with exact tokens. Before the role kept room for its
    configured peers, such a flood filled its max_connections and the honest client's
    connections were refused."""
    with HalfOpenFlood(addr(cluster, name)) as flood:
        time.sleep(0.5)
        rng = random.Random(4242)
        reqs = [ClientRequest(i, 0.2 * i, tuple(rng.randrange(512) for _ in range(48)), 24,
                              "honest") for i in range(6)]
        records = asyncio.run(asyncio.wait_for(
            Client(cluster.cfg, TcpTransport(), "client").run(reqs), 120))
        held_until_end = flood.opened - flood.closed_by_role
    print(f"{name}: flood opened {flood.opened}, the role closed {flood.closed_by_role}")
    assert [r["status"] for r in records] == ["completed"] * 6, [r["reason"] for r in records]
    assert all(v.match for v in verify_records(records, cluster.cfg.model))
    # the flood was real: it re-opened what the role closed (a few may be in between)
    assert held_until_end >= 295 and flood.closed_by_role > 0
    after_abuse(cluster)


def test_frames_announcing_huge_payloads_reserve_nothing(cluster):
    """Per role: 20 connections each announce a 30 MB KV_CHUNK (under the 32 MiB bound:
    accepted) and send 64 KB of it, then stall; 10 announce a 60 MB KV_CHUNK before
    HELLO and 10 a 60 MB REQUEST after it (both refused on the header). While the 20
    stall (600 MB announced per role) every role stays under its RSS bound; the
    frame timeout then closes them."""
    stalled, refused = [], []
    for name in ROLES:
        for _ in range(20):
            s = socket.create_connection(addr(cluster, name), timeout=10)
            s.sendall(encode_frame(Frame(0, Hello(Role.PREFILL, "evil-p")))
                      + header(MsgType.KV_CHUNK, 30_000_000, 10_000_000) + os.urandom(65536))
            stalled.append(s)
        for i in range(20):
            s = socket.create_connection(addr(cluster, name), timeout=10)
            s.sendall(header(MsgType.KV_CHUNK, 60_000_000) if i < 10
                      else hello(name) + header(MsgType.REQUEST, 60_000_000))
            refused.append(s)
    try:
        assert all(closed_by_peer(s, 3.0) for s in refused)
        time.sleep(0.3)
        peak = {name: rss(cluster, name) for name in ROLES}
        print("RSS MB while 600 MB per role are announced:", {n: peak[n] >> 20 for n in ROLES})
        assert all(peak[n] < cluster.rss_bound[n] for n in ROLES), (peak, cluster.rss_bound)
        assert all(closed_by_peer(s, 3.0) for s in stalled)  # frame_timeout_s 1 s
    finally:
        for s in stalled + refused:
            s.close()
    after_abuse(cluster)
