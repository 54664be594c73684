"""What every PDD role process shares: listening, greeting, dispatching, peer links.

Owns ``Peer`` (a connection plus who is on the other end) and ``RoleServer``,
the base class of P, RLD, MD and the router. Connection lifecycle:

- inbound: the role listens on its instance's (host, port); the first frame
  of every accepted connection must be HELLO, within ``limits.hello_timeout_s``
  (the decoder refuses any other type as the first frame on its header; else
  that connection is closed, the role keeps serving); the listener keeps room
  for the configured instances (``transport.Listener``: connections without
  HELLO or from an unconfigured peer are capped in all and per address, the
  oldest without HELLO closed to make room); then each frame goes to
  ``on_frame(peer, frame)``, one at a time per connection;
- every REQUEST, whoever sends it, is checked against the model first
  (``request_problem``: token ids in the vocabulary, prompt + max output
  within the context); a bad one is answered with ERROR(PROTOCOL, reason)
  and goes no further (``reject_request``);
- outbound: ``await self.peer(name)`` connects to another instance of the
  cluster on first use (retrying for ``timing.connect_timeout_s``), sends
  HELLO and reads that connection's frames into ``on_frame`` as well;
- either way, when a connection ends (peer closed, bad frame, our stop())
  ``on_peer_lost(peer)`` runs once.

Handlers must not block for long: long work (prefill, KV shipping) is
spawned as tasks with ``spawn``, which logs a task's crash.

Lifecycle of a role: ``await role.start()`` (listening) -> serve ->
``await role.stop()`` (idempotent: closes listener and every connection,
cancels spawned tasks).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import ClassVar, Mapping

from testbed import clock
from testbed.errors import ProtocolError
from testbed.types import PROTOCOL_EVENTS
from testbed.pdd.run.config import ClusterConfig, Instance
from testbed.pdd.compute.engine import ModelConfig
from testbed.pdd.wire.protocol import (Cancel, Error, ErrorCode, Frame, Hello, Message, MsgType,
                                  Report, Request, Role, frame_size)
from testbed.pdd.wire.transport import Connection, ConnectionClosed, Listener, Transport

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Peer:
    """A live connection and the role/name its HELLO announced."""

    conn: Connection
    role: Role
    name: str
    outbound: bool

    async def send(self, rid: int, message: Message) -> bool:
        """Send one frame; False (logged) if the connection is gone."""
        try:
            await self.conn.send(Frame(rid, message))
            return True
        except ConnectionClosed as err:
            log.info("cannot send %s for request %d to %s: %s",
                     message.MSG_TYPE.name, rid, self.name, err)
            return False


def request_problem(model: ModelConfig, req: Request) -> str | None:
    """Why the tiny model cannot serve ``req``, or None.

    >>> request_problem(ModelConfig(vocab_size=512, max_context=64), Request((1, 600), 4))
    'prompt has token id 600, outside the vocabulary of 512'
    """
    n, out = len(req.prompt_token_ids), req.max_output_tokens
    if n > model.max_context:
        return f"prompt of {n} tokens exceeds the model's context of {model.max_context} tokens"
    if out > model.max_context:
        return (f"max_output_tokens {out} exceeds the model's context of "
                f"{model.max_context} tokens")
    if n + out > model.max_context:
        return (f"prompt + max output ({n} + {out}) exceed the model's context of "
                f"{model.max_context} tokens")
    top = max(req.prompt_token_ids)
    if top >= model.vocab_size:
        return f"prompt has token id {top}, outside the vocabulary of {model.vocab_size}"
    return None


READ_TURN_S = 0.002  # a read loop yields after handling decoded frames this long
_STRAY_WARNINGS = 20  # stray frames logged as warnings per process; later ones at debug


def frame_bytes(message: Message) -> int:
    """Bytes a frame carrying ``message`` takes on the wire (header + payload + filler)."""
    return frame_size(message)


class RoleServer:
    """Base of the role processes (see the module docstring)."""

    ROLE: ClassVar[Role]

    def __init__(self, cfg: ClusterConfig, name: str, transport: Transport):
        self.cfg, self.transport = cfg, transport
        self.inst: Instance = cfg.instance(name)
        if self.inst.role != self.ROLE:
            raise ValueError(f"instance {name!r} is a {self.inst.role.name}, not {self.ROLE.name}")
        self.name = name
        self._listener: Listener | None = None
        self._out: dict[str, Peer] = {}
        self._connecting: dict[str, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        self._stopped = False
        self._routers: list[Peer] = []  # inbound connections greeting as the router, oldest first
        self.stray_frames = 0  # frames about unknown requests (or unexpected), dropped
        self.events_out = None  # a text file: protocol events, one JSON line each
        self.rejected_requests = 0  # REQUESTs answered with ERROR by request_problem

    @property
    def router(self) -> Peer | None:
        """The router's connection: the newest live inbound one whose HELLO gave the role
        ROUTER and the router instance's name (a restarted router greets again)."""
        while self._routers and self._routers[-1].conn.closed:
            self._routers.pop()
        return self._routers[-1] if self._routers else None

    async def report_status(self, data: dict) -> None:
        """A status REPORT (request id 0) to the router, if one is connected
        (testbed/pdd/wire/status.py: what ``data`` holds)."""
        router = self.router
        if router is not None:
            await router.send(0, Report(self.ROLE, self.name, data))

    @property
    def address(self) -> tuple[str, int]:
        return self._listener.address if self._listener else (self.inst.host, self.inst.port)

    async def start(self) -> None:
        self._listener = await self.transport.serve(self.inst.host, self.inst.port, self._serve)
        await self.on_start()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.on_stop()
        for task in list(self._tasks):
            task.cancel()
        if self._listener is not None:
            self._listener.close()
        for peer in list(self._out.values()):
            peer.conn.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._listener is not None:
            await self._listener.wait_closed()

    # -- hooks ---------------------------------------------------------------
    async def on_start(self) -> None:
        """Runs once listening."""

    async def on_stop(self) -> None:
        """Runs first in ``stop()``."""

    async def on_frame(self, peer: Peer, frame: Frame) -> None:
        raise NotImplementedError

    async def on_peer_lost(self, peer: Peer) -> None:
        """A connection ended (either direction)."""

    def held(self) -> Mapping[int, object]:
        """The requests this role holds now, by the router's request id: what
        ``limits.max_requests`` bounds and what the role drops when the router is lost."""
        return {}

    def active_requests(self) -> int:
        """Requests this role holds now (bounded by ``limits.max_requests``)."""
        return len(self.held())

    def protocol_event(self, kind: str, rid: int, **fields) -> None:
        """Write one protocol event (``testbed.types.PROTOCOL_EVENTS``) to the events
        file, if the process has one: ``{"t", "event", "role", "name", "rid", ...}``, ``t``
        the system-wide monotonic clock, one flushed line (a trigger may be waiting)."""
        if self.events_out is None:
            return
        assert kind in PROTOCOL_EVENTS, kind
        line = {"t": round(clock.now(), 6), "event": kind,
                "role": self.ROLE.name.lower(), "name": self.name, "rid": rid, **fields}
        self.events_out.write(json.dumps(line) + "\n")
        self.events_out.flush()

    def held_request_ids(self) -> list[int]:
        """The router's request ids this role holds now (what it drops when the router
        is lost)."""
        return list(self.held())

    async def _router_lost(self, peer: Peer) -> None:
        """The router's last connection ended: the requests it routed here can reach no
        client any more (a restarted router numbers its requests afresh and the client
        resumes them there), so each is dropped as if the router had sent CANCEL."""
        rids = self.held_request_ids()
        if rids:
            log.warning("%s: the router %s is gone: dropping the %d requests it routed here",
                        self.name, peer.name, len(rids))
        for rid in rids:
            await self.on_frame(peer, Frame(rid, Cancel()))

    async def reject_request(self, peer: Peer, rid: int, why: str,
                             code: ErrorCode = ErrorCode.PROTOCOL) -> None:
        """Answer a REQUEST this role will not take (``request_problem``, or
        ``limits.max_requests`` reached): ERROR with why."""
        await peer.send(rid, Error(code, f"rejected: {why}"))

    def stray(self, peer: Peer, frame: Frame, why: str = "unknown request") -> None:
        """Log (the first ``_STRAY_WARNINGS`` as warnings) and count a dropped frame."""
        self.stray_frames += 1
        level = logging.WARNING if self.stray_frames <= _STRAY_WARNINGS else logging.DEBUG
        log.log(level, "%s: dropped %s for request %d from %s: %s (%d dropped so far)",
                self.name, frame.msg_type.name, frame.request_id, peer.name, why,
                self.stray_frames)

    # -- helpers ---------------------------------------------------------------
    def spawn(self, coro: Coroutine, what: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{what}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task %s failed", self.name, task.get_name(),
                      exc_info=task.exception())

    def warm(self, names: list[str]) -> None:
        """Open connections to ``names`` in the background (a failure is left for first use)."""
        async def one(name: str) -> None:
            try:
                await self.peer(name)
            except ConnectionClosed:
                pass
        for name in names:
            self.spawn(one(name), f"warm {name}")

    def connected(self, name: str) -> Peer | None:
        """The open outbound connection to instance ``name``, or None (nothing is opened)."""
        peer = self._out.get(name)
        return peer if peer is not None and not peer.conn.closed else None

    async def peer(self, name: str) -> Peer:
        """The outbound connection to instance ``name``, opened on first use.

        Raises ConnectionClosed if it cannot be opened within the connect timeout.
        """
        if name in self._out and not self._out[name].conn.closed:
            return self._out[name]
        if name not in self._connecting:
            fut = asyncio.get_running_loop().create_future()
            self._connecting[name] = fut
            self.spawn(self._open(name, fut), f"connect {name}")
        return await asyncio.shield(self._connecting[name])

    async def _open(self, name: str, fut: asyncio.Future) -> None:
        try:
            conn = await self._connect_with_retry(self.cfg.instance(name))
            await conn.send(Frame(0, Hello(self.ROLE, self.name)))
            peer = Peer(conn, self.cfg.instance(name).role, name, outbound=True)
            self._out[name] = peer
            fut.set_result(peer)
        except (OSError, ConnectionClosed, asyncio.TimeoutError) as err:
            fut.set_exception(ConnectionClosed(f"{self.name} cannot reach {name}: {err}"))
            fut.exception()  # mark retrieved: callers may have gone
            return
        finally:
            del self._connecting[name]
        await self._read_loop(peer)

    async def _connect_with_retry(self, inst: Instance) -> Connection:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.timing.connect_timeout_s
        while True:
            try:
                return await self.transport.connect(inst.host, inst.port)
            except OSError:
                if loop.time() >= deadline or self._stopped:
                    raise
                await asyncio.sleep(0.05)

    async def _serve(self, conn: Connection) -> None:
        conn.expect_first(frozenset({MsgType.HELLO}))  # no KV buffered for a stranger
        timeout = self.cfg.limits.hello_timeout_s or None
        try:
            first = await asyncio.wait_for(conn.recv(), timeout)
        except asyncio.TimeoutError:
            raise ConnectionClosed(f"no HELLO from {conn.peer} within {timeout:g} s "
                                   "(limits.hello_timeout_s)") from None
        if not isinstance(first.message, Hello):  # expect_first lets nothing else through
            raise ProtocolError(f"first frame must be HELLO, got {first.msg_type.name}")
        hello = first.message
        member = any(i.name == hello.name and i.role == hello.role for i in self.cfg.instances)
        if self._listener is not None and \
                (why := self._listener.identified(conn, member)) is not None:
            raise ConnectionClosed(f"{hello.role.name} {hello.name!r} from {conn.peer} is no "
                                   f"configured instance and {why}")
        peer = Peer(conn, hello.role, hello.name, outbound=False)
        routers = {i.name for i in self.cfg.of_role(Role.ROUTER)}
        if hello.role == Role.ROUTER and hello.name in routers:
            self._routers = [p for p in self._routers if not p.conn.closed] + [peer]
        await self._read_loop(peer)

    def _refusal(self, req: Request) -> tuple[ErrorCode, str] | None:
        if (why := request_problem(self.cfg.model, req)) is not None:
            return ErrorCode.PROTOCOL, why
        if (n := self.active_requests()) >= self.cfg.limits.max_requests:
            return ErrorCode.OVERLOADED, f"{n} requests held (limits.max_requests)"
        return None

    async def _read_loop(self, peer: Peer) -> None:
        # recv returns frames already decoded from one read without yielding: after a
        # burst (hundreds of TOKENS frames from a decoder's steps) this loop would hold
        # the event loop until all were handled, delaying every other peer's frames and
        # timers. Yield once it has run this long.
        turn: float | None = None  # when this run of already decoded frames began
        try:
            while True:
                if not peer.conn.buffered_frames:
                    turn = None  # recv reads from the socket: it waits, the loop turns
                elif turn is None:
                    turn = clock.now()
                elif clock.now() - turn > READ_TURN_S:
                    await asyncio.sleep(0)
                    turn = clock.now()
                frame = await peer.conn.recv()
                if isinstance(frame.message, Request) and \
                        (refusal := self._refusal(frame.message)) is not None:
                    self.rejected_requests += 1
                    log.warning("%s: request %d from %s rejected: %s", self.name,
                                frame.request_id, peer.name, refusal[1])
                    await self.reject_request(peer, frame.request_id, refusal[1], refusal[0])
                    continue
                await self.on_frame(peer, frame)
        except (ConnectionClosed, ProtocolError) as err:
            if not peer.outbound:
                raise  # run_handler logs it and closes only this connection
            log.info("%s: connection to %s ended: %s", self.name, peer.name, err)
        finally:
            peer.conn.close()
            if self._out.get(peer.name) is peer:
                del self._out[peer.name]
            if not self._stopped:
                await self.on_peer_lost(peer)
                if not peer.outbound and peer.role == Role.ROUTER and self.router is None \
                        and any(i.name == peer.name for i in self.cfg.of_role(Role.ROUTER)):
                    await self._router_lost(peer)
