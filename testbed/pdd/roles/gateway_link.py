"""The gateway's side of the PDD protocol: one client connection to the router.

Owns ``RouterLink``: the gateway speaks to the router exactly as the
built-in client does (``client.py``): HELLO as a CLIENT, one REQUEST
(prompt ids, max_out, {id, session}) per HTTP request under a fresh wire
request id, CANCEL when the HTTP client goes away or the request times out
(``cfg.client.request_timeout_s``). Every TOKENS / DONE / ERROR / REPORT
goes into the request's ``RequestTrace`` (``client_record.py``), so each
request ends as one requests.jsonl line of the same format the client
writes, plus a ``gateway`` object (api, stream, HTTP status, the HTTP
client's view of TTFT: request received -> first token written, and why
the request was abandoned, if it was). A line is appended once the request
is over and its REPORTs are in (or ``cfg.client.report_grace_s`` later),
and at ``close()`` for whatever is still open.

Lifecycle: ``connect()`` -> ``open(...)`` per HTTP request -> ``next_ids``
until ``Live.over`` -> ``finish(live)`` (records it; CANCELs it if it was
not over) -> ``close()``. A record reaches the file within FLUSH_EVERY_S of
being written (one flush per interval, not per record), and at ``close()``. Losing the router fails every open request
("router connection lost"); the next ``open`` connects again (an
``ApiError`` 503 if the router does not answer).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed import clock
from testbed.errors import ApiError, ProtocolError
from testbed.pdd.roles.client_record import ClientRequest, RequestTrace
from testbed.pdd.run.config import ClusterConfig
from testbed.pdd.wire.protocol import Cancel, Frame, Hello, Request, Role
from testbed.pdd.wire.transport import Connection, ConnectionClosed, Transport

log = logging.getLogger(__name__)
FLUSH_EVERY_S = 0.05  # records reach the file at most this long after the request ends


@dataclass(eq=False)
class Live:
    """One HTTP request's generation at the router."""

    rid: int  # wire request id
    trace: RequestTrace
    info: dict  # the record's "gateway" object
    t_received: float  # clock.now() when the HTTP request arrived
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    next_pos: int = 0  # first position not yet handed to the HTTP side
    on_released: Callable[[], None] | None = None  # called once: the roles let it go

    @property
    def over(self) -> bool:
        return self.trace.terminal

    def take(self) -> list[int]:
        """Token ids of the new contiguous positions from ``next_pos`` on."""
        out, tokens = [], self.trace.tokens
        while self.next_pos in tokens:
            out.append(tokens[self.next_pos][0])
            self.next_pos += 1
        return out


class RouterLink:
    """The gateway's connection to the router (see the module docstring)."""

    def __init__(self, cfg: ClusterConfig, name: str, transport: Transport, out: str | Path):
        self.cfg, self.name, self.transport = cfg, name, transport
        self._out = open(out, "a")
        self._flush: asyncio.TimerHandle | None = None
        self._conn: Connection | None = None
        self._reader: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._rids = itertools.count(1)
        self._ids = itertools.count(0)  # the record's id (the HTTP response's cmpl-N)
        self.live: dict[int, Live] = {}
        self._recording: dict[int, asyncio.Task] = {}
        # recorded at the grace but some REPORT still out (a relayed request's WAN
        # transfer goes on after DONE): the router still holds it; released when it is in
        self._unreleased: dict[int, Live] = {}
        self._t0 = clock.now()

    @property
    def connected(self) -> bool:
        return self._conn is not None

    async def connect(self) -> None:
        """Connect to the router and say HELLO (ConnectionClosed if it does not answer)."""
        async with self._lock:
            if self._conn is not None:
                return
            router = self.cfg.of_role(Role.ROUTER)[0]
            conn = await self.transport.connect(router.host, router.port)
            await conn.send(Frame(0, Hello(Role.CLIENT, self.name, {"api": "openai"})))
            self._conn = conn
            self._reader = asyncio.get_running_loop().create_task(self._read(conn))

    def refuse(self, prompt: tuple[int, ...], max_out: int, session, info: dict,
               t_received: float, reason: str) -> None:
        """Record a request the gateway answered without sending it (429): failed, with
        ``reason``."""
        seq = next(self._ids)
        req = ClientRequest(seq, round(t_received - self._t0, 6), prompt, max_out, session)
        trace = RequestTrace(req, t_sent=clock.now())
        trace.fail(reason)
        self._append(trace, dict(info, id=f"cmpl-{seq}"))

    async def open(self, prompt: tuple[int, ...], max_out: int, session, info: dict,
                   t_received: float) -> Live:
        """Send one REQUEST; the returned Live collects what comes back."""
        if self._conn is None:
            try:
                await self.connect()
            except (ConnectionClosed, OSError) as err:
                raise ApiError(503, f"the router is unreachable: {err}", type="server_error",
                               code="router_unavailable") from None
        seq, rid = next(self._ids), next(self._rids)
        req = ClientRequest(seq, round(t_received - self._t0, 6), prompt, max_out, session)
        live = Live(rid, RequestTrace(req), dict(info, id=f"cmpl-{seq}"), t_received)
        self.live[rid] = live
        live.trace.t_sent = clock.now()
        conn = self._conn
        try:
            if conn is None:
                raise ConnectionClosed("the router connection was lost")
            await conn.send(Frame(rid, Request(prompt, max_out, {"id": seq, "session": session})))
        except (ConnectionClosed, ProtocolError) as err:
            live.trace.fail(f"cannot send: {err}")
        return live

    async def next_ids(self, live: Live, deadline: float) -> list[int]:
        """The next in-order token ids, waiting for them until ``deadline`` (loop time);
        [] once the request is over. On the deadline the request fails ("timeout")."""
        loop = asyncio.get_running_loop()
        while True:
            live.changed.clear()
            ids = live.take()
            if ids or live.over:
                return ids
            try:
                await asyncio.wait_for(live.changed.wait(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                self.abandon(live, f"timeout after {self.cfg.client.request_timeout_s:g} s")
                return []

    def abandon(self, live: Live, reason: str) -> None:
        """Fail ``live`` with ``reason`` and CANCEL it at the router (if it was open)."""
        if live.over:
            return
        live.trace.fail(reason)
        live.info["abandoned"] = reason
        conn = self._conn
        if conn is not None:
            asyncio.get_running_loop().create_task(self._cancel(conn, live.rid))

    @staticmethod
    async def _cancel(conn: Connection, rid: int) -> None:
        try:
            await conn.send(Frame(rid, Cancel()))
        except (ConnectionClosed, ProtocolError):
            pass

    def finish(self, live: Live, reason: str = "client disconnected",
               on_released: Callable[[], None] | None = None) -> None:
        """The HTTP side is done with ``live``: CANCEL it if still open, then record it
        once its REPORTs are in, or report_grace_s later. ``on_released`` is called once
        every REPORT is in (the router has let the request go: the gateway's admission
        slot is freed then, so that the router never holds more requests than the
        gateway admitted), at the latest request_timeout_s after the record (a REPORT
        that never comes holds no slot for ever), or when the router connection is
        lost or the link closes."""
        live.on_released = on_released
        self.abandon(live, reason)
        task = asyncio.get_running_loop().create_task(self._record_when_reported(live))
        self._recording[live.rid] = task

    async def _record_when_reported(self, live: Live) -> None:
        tr = live.trace
        try:
            await asyncio.wait_for(self._until(live, lambda: tr.reports_complete and not (
                tr.done and tr.lost_positions())), self.cfg.client.report_grace_s)
        except asyncio.TimeoutError:
            pass
        self._write(live)
        if not tr.reports_complete and live.on_released is not None:
            self._unreleased[live.rid] = live
            try:
                await asyncio.wait_for(self._until(live, lambda: tr.reports_complete),
                                       self.cfg.client.request_timeout_s)
            except asyncio.TimeoutError:
                pass
        self._release(live)

    def _release(self, live: Live) -> None:
        self._unreleased.pop(live.rid, None)
        self._recording.pop(live.rid, None)
        callback, live.on_released = live.on_released, None
        if callback is not None:
            callback()

    @staticmethod
    async def _until(live: Live, cond) -> None:
        while not cond():
            live.changed.clear()
            await live.changed.wait()

    def _write(self, live: Live) -> None:
        if self.live.pop(live.rid, None) is None:
            return  # already written
        self._append(live.trace, live.info)

    def _append(self, trace: RequestTrace, info: dict) -> None:
        """One line of the records file: the request's record with the gateway's info."""
        rec = trace.record(self.cfg.mode.value, self.cfg.relay.handoff_mode.value)
        rec["gateway"] = info
        self._out.write(json.dumps(rec, separators=(",", ":")) + "\n")
        if self._flush is None:  # one write to the file per FLUSH_EVERY_S, not per record:
            self._flush = asyncio.get_running_loop().call_later(  # under a flood of 429s
                FLUSH_EVERY_S, self._flush_out)                   # a syscall each was a cost

    def _flush_out(self) -> None:
        self._flush = None
        if not self._out.closed:
            self._out.flush()

    async def _read(self, conn: Connection) -> None:
        try:
            while True:
                frame = await conn.recv()
                live = self.live.get(frame.request_id) or \
                    self._unreleased.get(frame.request_id)
                if live is not None:
                    self._on_frame(live, frame.message)
                    live.changed.set()
        except (ConnectionClosed, ProtocolError) as err:
            if self._conn is conn:
                self._conn = None
            for live in list(self.live.values()):
                live.trace.fail(f"router connection lost: {err}")
                live.changed.set()
            for live in list(self._unreleased.values()):  # their REPORTs will not come
                self._release(live)

    @staticmethod
    def _on_frame(live: Live, msg) -> None:
        trace = live.trace
        trace.on_message(msg, clock.now())

    async def close(self) -> None:
        """Record what is still open (as it stands), close the connection."""
        for live in list(self.live.values()):
            self.abandon(live, "gateway stopped")
        await asyncio.sleep(0)  # let the CANCELs go out
        for task in list(self._recording.values()):
            task.cancel()
        for live in list(self.live.values()):
            self._write(live)
            self._release(live)
        for live in list(self._unreleased.values()):
            self._release(live)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self._out.close()
