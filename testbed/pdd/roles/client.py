"""The client role: open-loop replay of a workload against the router, and requests.jsonl.

Lifecycle of ``Client.run(requests)``: connect to the router (HELLO) ->
send each REQUEST(prompt, max_out, {id, session}) at ``t0 + arrival_s``
whatever the state of earlier ones (open loop) -> record every TOKENS /
DONE / ERROR / REPORT in the request's ``RequestTrace`` -> a request not
terminal ``request_timeout_s`` after it was sent fails ("timeout") and the
router gets CANCEL -> once every request is terminal, wait up to
``report_grace_s`` for the roles' REPORTs (and straggling tokens) -> close
and return one record per request (``client_record``), in workload order.
Losing the router (its connection ends: killed, restarted) interrupts
every request sent on that connection that has not ended. The client
connects again (every ``RECONNECT_S``) and *resumes* each: a new REQUEST
whose prompt is the original prompt plus the tokens already received at
positions 0..k-1 and whose max output is the rest, positions shifted by k
on arrival, so no token the client holds is asked for again (greedy
decoding makes the continuation the same tokens the whole request would
have had; ``verify`` checks it). A request is resumed at most
``MAX_RESUMES`` times, then fails ("router connection lost: ..."). A
request whose arrival comes while no router answers waits for one; every
request's ``request_timeout_s`` counts from its arrival, waits and resumes
included ("router unreachable" or "timeout" after it).
Warm-up requests (``ClientRequest.warmup``) carry ``warmup`` in their metadata;
``python -m testbed.pdd.run.node`` replays them, and checks they all completed,
before it announces "ready" and replays the measured requests.

Example::

    reqs = [ClientRequest(0, 0.0, tuple(range(1, 65)), 32)]
    records = await Client(cfg, transport).run(reqs)
    write_records("requests.jsonl", records)
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Iterable, Sequence

from testbed import clock
from testbed.errors import ProtocolError, SpecError
from testbed.pdd.roles.client_record import ClientRequest, RequestTrace
from testbed.pdd.run.config import ClusterConfig
from testbed.pdd.wire.protocol import Cancel, Frame, Hello, Request, Role, Tokens
from testbed.pdd.wire.transport import Connection, ConnectionClosed, Transport
from testbed.strict import MAX_INT, finite, parse_json, read_text

log = logging.getLogger(__name__)
RECONNECT_S = 0.2  # between attempts to reach the router again after losing it
MAX_RESUMES = 3  # times one request is resumed after losing the router

__all__ = ["Client", "ClientRequest", "load_requests", "write_records", "from_workload",
           "warmup_problems"]


class Client:
    """Replays requests against the cluster's router (see the module docstring)."""

    def __init__(self, cfg: ClusterConfig, transport: Transport, name: str = "client",
                 on_end=None):
        """``on_end(request_id)`` is called once per request when it ends (progress)."""
        self.cfg, self.transport, self.name = cfg, transport, name
        self.on_end = on_end
        self.traces: dict[int, RequestTrace] = {}  # by wire request id (1..)
        self._conn: Connection | None = None
        self._sent_on: dict[int, Connection] = {}  # request id -> the connection it went on
        self._offset: dict[int, int] = {}  # request id -> its resumed round's first position
        self._interrupted: list[int] = []  # requests to resume once the router is back
        self.reconnects = 0  # router connections made after the first
        self._changed = asyncio.Event()  # anything changed (a connection, any request)
        self._changed_rid: dict[int, asyncio.Event] = {}  # this request's frames arrived
        self._t0 = 0.0

    async def _connect(self) -> Connection:
        router = self.cfg.of_role(Role.ROUTER)[0]
        conn = await self.transport.connect(router.host, router.port)
        await conn.send(Frame(0, Hello(Role.CLIENT, self.name)))
        return conn

    async def run(self, requests: Sequence[ClientRequest]) -> list[dict]:
        try:
            self._conn = await self._connect()
        except (OSError, ConnectionClosed) as err:  # the router not (yet, or any more) up:
            log.warning("router unreachable at start (%s); connecting again every %g s",
                        err, RECONNECT_S)  # each request waits for it, then fails
            self._conn = None
        self.traces = {i + 1: RequestTrace(r) for i, r in enumerate(requests)}
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read())
        self._t0 = loop.time() - min((r.arrival_s for r in requests), default=0.0)
        try:
            await asyncio.gather(*(self._send(rid, tr) for rid, tr in self.traces.items()))
            await self._wait(lambda: all(t.terminal for t in self.traces.values()), None)
            await self._wait(lambda: all(t.reports_complete and not (t.done and t.lost_positions())
                                         for t in self.traces.values()),
                             self.cfg.client.report_grace_s)
        finally:
            reader.cancel()
            if self._conn is not None:
                self._conn.close()
            await asyncio.gather(reader, return_exceptions=True)
        c = self.cfg
        return [t.record(c.mode.value, c.relay.handoff_mode.value) for t in self.traces.values()]

    async def _send(self, rid: int, trace: RequestTrace) -> None:
        """Send at the arrival time, then enforce the request's timeout."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, self._t0 + trace.req.arrival_s - loop.time()))
        req = trace.req
        trace.t_sent = clock.now()
        meta = {"id": req.id, "session": req.session}
        if req.warmup:
            meta["warmup"] = True
        timeout = self.cfg.client.request_timeout_s
        deadline = loop.time() + timeout
        try:
            await asyncio.wait_for(self._until(lambda: self._conn is not None), timeout)
        except asyncio.TimeoutError:
            trace.fail(f"router unreachable for {timeout:g} s (request_timeout_s)")
            self._ended(trace)
            return
        conn = self._conn
        self._sent_on[rid] = conn
        try:
            await conn.send(Frame(rid, Request(req.prompt, req.max_out, meta)))
        except (ConnectionClosed, ProtocolError):
            pass  # the reader sees the connection end and resumes the request
        try:
            await asyncio.wait_for(self._until(lambda: trace.terminal,
                                               self._changed_rid.setdefault(rid, asyncio.Event())),
                                   max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            trace.fail(f"timeout after {timeout:g} s")
            self._wake(rid)
            try:
                await self._sent_on[rid].send(Frame(rid, Cancel()))
            except ConnectionClosed:
                pass
        self._ended(trace)

    def _ended(self, trace: RequestTrace) -> None:
        self._changed.set()
        if self.on_end is not None:
            self.on_end(trace.req.id)

    async def _until(self, cond, event: asyncio.Event | None = None) -> None:
        """Wait until ``cond()``, checked whenever ``event`` (default: any change) is set:
        a request waits on its own event, so a frame wakes one waiter, not all of them."""
        event = event or self._changed
        while not cond():
            event.clear()
            await event.wait()

    def _wake(self, rid: int | None = None) -> None:
        """A change: to request ``rid`` (its waiter and the run's), or to all (None)."""
        self._changed.set()
        if rid is None:
            for event in self._changed_rid.values():
                event.set()
        elif (event := self._changed_rid.get(rid)) is not None:
            event.set()

    async def _wait(self, cond, timeout_s: float | None) -> None:
        try:
            await asyncio.wait_for(self._until(cond), timeout_s)
        except asyncio.TimeoutError:
            pass

    async def _read(self) -> None:
        """Read the router's frames; on losing it, fail what was sent on that connection
        and connect again."""
        while True:
            conn = self._conn
            try:
                while conn is not None:
                    frame = await conn.recv()
                    self._on_frame(conn, frame)
                    self._wake(frame.request_id)
            except (ConnectionClosed, ProtocolError) as err:
                conn.close()
                self._conn = None
                for rid, t in self.traces.items():
                    if self._sent_on.get(rid) is conn and not t.terminal:
                        if t.resumes < MAX_RESUMES:
                            self._interrupted.append(rid)
                        else:
                            t.fail(f"router connection lost: {err} ({t.resumes} resumes)")
                self._wake()
            while self._conn is None:
                await asyncio.sleep(RECONNECT_S)
                try:
                    self._conn = await self._connect()
                except (OSError, ConnectionClosed):
                    continue
                self.reconnects += 1
                self._wake()
            await self._resume_interrupted()

    async def _resume_interrupted(self) -> None:
        """Send each interrupted request again from its first missing position."""
        conn, todo, self._interrupted = self._conn, self._interrupted, []
        for rid in todo:
            t = self.traces[rid]
            if t.terminal:
                continue
            k = t.resume()
            if k >= t.req.max_out:  # every token arrived; only DONE was lost
                t.done = True
                self._wake(rid)
                continue
            req, held = t.req, tuple(t.tokens[p][0] for p in range(k))
            meta = {"id": req.id, "session": req.session, "resumed_from": k}
            self._sent_on[rid], self._offset[rid] = conn, k
            try:
                await conn.send(Frame(rid, Request(req.prompt + held, req.max_out - k, meta)))
            except (ConnectionClosed, ProtocolError):
                return  # the reader sees it and resumes again

    def _on_frame(self, conn: Connection, frame: Frame) -> None:
        trace, msg = self.traces.get(frame.request_id), frame.message
        if trace is None or self._sent_on.get(frame.request_id) is not conn:
            return
        k = self._offset.get(frame.request_id, 0)
        if k and isinstance(msg, Tokens):
            msg = Tokens(msg.producer, msg.start_position + k, msg.token_ids)
        trace.on_message(msg, clock.now())


def from_workload(requests: Iterable) -> list[ClientRequest]:
    """ClientRequests from ``testbed.workload`` Requests (id, arrival_s, prompt, output_len,
    session): ``from_workload(load_workload(path).requests)``."""
    return [ClientRequest(r.id, r.arrival_s, tuple(r.prompt), r.output_len, r.session,
                          r.designed_hit_rate) for r in requests]


WORKLOAD_KEYS = ("id", "arrival_s", "prompt", "max_out", "session", "designed_hit_rate",
                 "warmup")
MAX_TOKEN_ID = 2**31 - 1


def load_requests(path: str | Path) -> list[ClientRequest]:
    """Read a JSONL workload: one {"id", "arrival_s", "prompt", "max_out", "session",
    "designed_hit_rate", "warmup"} per line (all but id, prompt and max_out optional).

    Any other key, a wrong type or a non-finite number is a SpecError naming the
    file, the line and the field.
    """
    file, out = str(path), []
    for n, line in enumerate(read_text(file, "JSONL workload").split("\n"), 1):
        if line.strip():
            obj = parse_json(line, file, f"line {n}", "a JSON object")
            out.append(_request_of(obj, file, f"line {n}"))
    return out


def _is_int(v: object, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and finite(v)


def _request_of(obj: object, file: str, where: str) -> ClientRequest:
    """One workload line's request, every field checked."""
    if not isinstance(obj, dict):
        raise SpecError(file, where, "a JSON object", obj)
    for key in obj:
        if key not in WORKLOAD_KEYS:
            raise SpecError(file, f"{where}: {key}", "a known field (one of "
                            + ", ".join(WORKLOAD_KEYS) + ")", key)
    checks = (("id", ..., lambda v: _is_int(v, 0, MAX_INT), "an integer id >= 0"),
              ("arrival_s", 0.0, _is_num, "a finite time in s"),
              ("prompt", ..., lambda v: isinstance(v, list) and len(v) > 0 and all(
                  _is_int(t, 0, MAX_TOKEN_ID) for t in v), "a non-empty list of token ids"),
              ("max_out", ..., lambda v: _is_int(v, 1, MAX_INT), "an integer >= 1"),
              ("session", 0, lambda v: isinstance(v, str) or _is_int(v, -MAX_INT, MAX_INT),
               "an integer or a string"),
              ("designed_hit_rate", None, lambda v: v is None or _is_num(v), "a finite number"),
              ("warmup", False, lambda v: isinstance(v, bool), "true or false"))
    values = {}
    for key, default, ok, expected in checks:
        if key not in obj and default is ...:
            raise SpecError(file, f"{where}: {key}", "this field to be set", "nothing")
        values[key] = obj.get(key, default)
        if not ok(values[key]):
            raise SpecError(file, f"{where}: {key}", expected, values[key])
    return ClientRequest(values["id"], float(values["arrival_s"]), tuple(values["prompt"]),
                         values["max_out"], values["session"], values["designed_hit_rate"],
                         values["warmup"])


def warmup_problems(records: Sequence[dict]) -> list[str]:
    """Why a warm-up did not do its job (a request failed, lost or repeated tokens)."""
    out = []
    for r in records:
        if r["status"] != "completed":
            out.append(f"warm-up request {r['id']}: {r['status']} ({r['reason']})")
        elif r["tokens_lost"] or r["tokens_duplicated"]:
            out.append(f"warm-up request {r['id']}: {r['tokens_lost']} tokens lost, "
                       f"{r['tokens_duplicated']} duplicated")
    return out


def write_records(path: str | Path, records: Iterable[dict]) -> None:
    """Write requests.jsonl: one JSON object per line."""
    with open(path, "w") as f:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
