"""The main decode role MD (DC B): DRC lookup, WAN KV receive, handoff extend, decoding.

Request lifecycle at MD (docs/pdd-roles.md, steps 4-7):

1. REQUEST (+ token 0) from P: look the prompt up in the decode-side radix
   cache (DRC, block ``prefill.block_size``, values = per-block KV
   segments); the KV of the hit comes from the DRC; answer KV_NEED(start).
   If another request's KV now crossing the WAN (or itself waiting) shares a
   longer block-aligned prefix than the DRC holds, MD first waits for that
   transfer's KV_DONE and then asks only for what the DRC still lacks: a
   prefix crosses the WAN once, however many turns of a session arrive
   while it is in flight. (Without this, a slow WAN made every next turn
   re-fetch its whole prompt: measured in link-flap.yaml, MD's hit rate
   fell to 0.14 against P's 0.84, and the extra bytes kept the WAN
   saturated for the rest of the run: the baseline's TTFT p50 was 46 s.)
2. KV_CHUNKs [start, n) over the WAN, then KV_DONE: the prompt's blocks go
   into the DRC (deduplicated; MD's hit rate is reported next to P's).
3. ``p-md``: MD emits token 0 and joins its continuous batch (GPU_B).
   ``p-rld-md``: MD sends KV_READY(n) to the request's RLD and waits for
   HANDOFF batches. Each batch: the token ids MD has not applied yet
   (``handoff.MainHandoff``) are recomputed with one ``extend`` pass that
   joins a decode step; a non-final batch is answered with HANDOFF_ACK; after
   the final batch MD emits from position m (the token the extend predicted)
   and decodes to the end. A HANDOFF may arrive before the KV (the router
   re-sends RLD's tokens when RLD died): it waits for KV_DONE.
4. The last token: DONE to the router. Every request MD knew ends with one
   REPORT (also on CANCEL, e.g. when RLD finished the request itself).

If P's connection closes while MD still waits for KV, MD reports the loss
with ERROR(UNAVAILABLE) for each such request and drops it.

WAN status (for the router's ``WanModel``): every
``main.wan_status_interval_s`` MD sends the router a REPORT with request
id 0, a ``WanStatus`` (testbed/pdd/wire/status.py): the bytes read from P's
connections in the interval (wire units), whether a KV transfer was
receiving chunks throughout it (so the rate is what the path gave, not what
the workload offered), the wire bytes each pending transfer still misses
and the KV_DONE time of each transfer completed in the interval (monotonic
clock). Nothing is sent while no transfer is pending and nothing arrived.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field

from testbed import clock
from testbed.pdd.run.config import ClusterConfig
from testbed.types import Pipeline
from testbed.pdd.compute.decoder import Emitted, Seq
from testbed.pdd.roles.handoff import MainHandoff
from testbed.pdd.compute.engine import Cache
from testbed.pdd.roles.decoding import DecodingRoleServer
from testbed.pdd.roles.peers import Peer
from testbed.pdd.roles.prefill import block_segments, cache_from_blocks
from testbed.pdd.wire.protocol import (Cancel, Done, Error, ErrorCode, FinishReason, Frame, Handoff,
                                  HandoffAck, Health, HealthAck, KvChunk, KvDone, KvNeed, KvReady,
                                  ProtocolError, Report, Request, Role, Tokens)
from testbed.pdd.compute.radix import RadixCache, common_prefix_of_keys, token_key
from testbed.pdd.wire.transport import ConnectionClosed, Transport
from testbed.pdd.wire.status import WanStatus


@dataclass(eq=False)
class MainState:
    """One request at MD, from P's REQUEST to its REPORT."""

    rid: int
    request: Request
    p_peer: Peer
    cache: Cache
    handoff: MainHandoff
    t_need: float = 0.0
    expected_wire: int = 0  # KV_CHUNK payload bytes of [start, n): what P will send
    kv_done: bool = False
    batches: list[tuple[Peer, Handoff]] = field(default_factory=list)  # waiting for the KV
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    kv_event: asyncio.Event = field(default_factory=asyncio.Event)  # KV_DONE, or freed
    seq: Seq | None = None
    report: dict = field(default_factory=lambda: {"kv_wan_bytes": 0, "kv_chunks": 0,
                                                  "extend_tokens": 0, "handoff_batches": 0})

    @property
    def pipeline(self) -> Pipeline:
        return Pipeline(self.request.metadata["pipeline"])

    @functools.cached_property
    def prompt_key(self) -> bytes:
        """The prompt as ``token_key`` bytes, for comparing it with other prompts."""
        return token_key(self.request.prompt_token_ids)


class MainDecodeNode(DecodingRoleServer):
    """MD: see the module docstring."""

    ROLE = Role.MAIN_DECODE

    def __init__(self, cfg: ClusterConfig, name: str, transport: Transport):
        super().__init__(cfg, name, transport, chunk_tokens=cfg.main.extend_chunk_tokens)
        self.drc = RadixCache(cfg.prefill.block_size, cfg.main.drc_capacity_tokens)
        self.states: dict[int, MainState] = {}
        self.cancelled: set[int] = set()
        self.early: dict[int, list[tuple[Peer, Handoff]]] = {}  # HANDOFFs before the REQUEST
        self._kv_sources: dict[int, Peer] = {}  # P connections, by id
        self._receiving: set[int] = set()  # rids with chunks arriving, KV_DONE not yet
        self._busy_all_interval = False
        self._rx_mark = 0
        self._kv_done_ids: dict[str, float] = {}  # transfers completed since the last status

    async def on_start(self) -> None:
        await super().on_start()
        self.warm([i.name for i in self.cfg.of_role(Role.RELAY_DECODE)])
        self.spawn(self._wan_status_loop(), "wan status")

    async def _wan_status_loop(self) -> None:
        interval = self.cfg.main.wan_status_interval_s
        t_last = clock.now()
        while True:
            await asyncio.sleep(interval)
            now = clock.now()
            rx = sum(p.conn.bytes_received for p in self._kv_sources.values())
            delta, self._rx_mark = rx - self._rx_mark, rx
            pending = {st.rid: max(0, st.expected_wire - st.report["kv_wan_bytes"])
                       for st in self.states.values() if st.t_need and not st.kv_done}
            busy = self._busy_all_interval
            self._busy_all_interval = bool(self._receiving)
            done, self._kv_done_ids = self._kv_done_ids, {}
            if pending or delta or done:
                await self.report_status(WanStatus(now - t_last, delta, busy, pending, done).data())
            t_last = now

    def held(self) -> dict:
        return self.states

    async def on_frame(self, peer: Peer, frame: Frame) -> None:
        rid, msg = frame.request_id, frame.message
        st = self.states.get(rid)
        if isinstance(msg, Health):
            await peer.send(rid, HealthAck(msg.nonce, self.decoder.load, len(self.states)))
        elif isinstance(msg, Request):
            await self._on_request(peer, rid, msg)
        elif isinstance(msg, Cancel):
            await self._on_cancel(rid, st)
        elif st is None:
            if rid in self.cancelled:
                return  # cancelled or finished meanwhile
            if isinstance(msg, Handoff) and (rid in self.early or
                                             len(self.early) < self.cfg.limits.max_requests):
                self.early.setdefault(rid, []).append((peer, msg))
            else:
                self.stray(peer, frame)
        elif isinstance(msg, KvChunk):
            self._on_chunk(st, msg)
        elif isinstance(msg, KvDone):
            await self._on_kv_done(st, msg)
        elif isinstance(msg, Handoff):
            st.batches.append((peer, msg))
            if st.kv_done:
                self.spawn(self._apply_batches(st), f"handoff {rid}")

    async def _on_request(self, peer: Peer, rid: int, req: Request) -> None:
        if rid in self.cancelled or rid in self.states:
            await peer.send(rid, Cancel())
            return
        hit = self.drc.match(req.prompt_token_ids)
        st = MainState(rid, req, peer, self._cache_of(req, hit),
                       MainHandoff(int(req.metadata["token0"])),
                       batches=self.early.pop(rid, []))
        self.states[rid] = st
        self._kv_sources[id(peer)] = peer
        src, shared = self._inflight_prefix(st, hit.n_tokens)
        if src is not None:
            st.report.update(inflight_wait_for=src.rid, inflight_shared_tokens=shared)
            self.spawn(self._need_after(st, src), f"need {rid} after {src.rid}")
            return
        await self._send_need(st, hit)

    def _cache_of(self, req: Request, hit) -> Cache:
        return cache_from_blocks(self.model, hit.values,
                                 len(req.prompt_token_ids) + req.max_output_tokens)

    def _inflight_prefix(self, st: MainState, drc_hit: int) -> tuple[MainState | None, int]:
        """The request whose KV, not yet at MD, shares the longest block-aligned
        prefix with ``st``'s prompt beyond what the DRC holds (None if none does)."""
        bs = self.cfg.prefill.block_size
        best, best_len = None, drc_hit
        for other in self.states.values():
            if other is st or other.kv_done:
                continue
            n = common_prefix_of_keys(st.prompt_key, other.prompt_key) // bs * bs
            if n > best_len:
                best, best_len = other, n
        return best, best_len

    async def _need_after(self, st: MainState, src: MainState) -> None:
        """KV_NEED once ``src``'s KV is in the DRC (or ``src`` is gone)."""
        t0 = clock.now()
        await src.kv_event.wait()
        if self.states.get(st.rid) is not st:
            return  # cancelled meanwhile
        hit = self.drc.match(st.request.prompt_token_ids)
        st.cache = self._cache_of(st.request, hit)
        st.report["inflight_wait_s"] = clock.now() - t0
        await self._send_need(st, hit)

    async def _send_need(self, st: MainState, hit) -> None:
        n = len(st.request.prompt_token_ids)
        st.report.update(md_hit_rate=hit.n_tokens / n, drc_hit_tokens=hit.n_tokens)
        st.expected_wire = self._expected_wire(hit.n_tokens, n)
        st.t_need = clock.now()
        await st.p_peer.send(st.rid, KvNeed(hit.n_tokens, n))

    def _expected_wire(self, start: int, n: int) -> int:
        """Payload bytes of the KV_CHUNKs of [start, n) (modeled sizes, P's chunking)."""
        step = self.cfg.prefill.kv_chunk_tokens
        return sum(self.cfg.timing.modeled_kv_bytes(min(n, s + step) - s)
                   for s in range(start, n, step))

    def _on_chunk(self, st: MainState, msg: KvChunk) -> None:
        st.report["kv_wan_bytes"] += self.take_chunk(st.cache, msg)
        st.report["kv_chunks"] += 1
        self._receiving.add(st.rid)

    async def _on_kv_done(self, st: MainState, msg: KvDone) -> None:
        prompt = st.request.prompt_token_ids
        if st.cache.length != len(prompt) or msg.num_tokens != len(prompt):
            raise ProtocolError(f"KV_DONE for {msg.num_tokens} tokens, MD holds "
                                f"{st.cache.length} of a {len(prompt)}-token prompt")
        bs = self.cfg.prefill.block_size
        self.drc.insert(prompt, block_segments(st.cache, len(prompt), bs))
        st.kv_done = True
        self.protocol_event("kv_done", st.rid, tokens=len(prompt))
        st.kv_event.set()  # requests waiting for this prefix may ask for the rest now
        self._kv_done_ids[str(st.rid)] = clock.now()
        self._not_receiving(st.rid)
        st.report.update(kv_transfer_s=clock.now() - st.t_need, t_kv_done=clock.now(),
                         drc_hit_rate=self.drc.stats.hit_rate)
        if st.pipeline == Pipeline.P_MD:
            await self._start_decoding(st, 0, st.handoff.first_token)
        else:
            self.spawn(self._kv_ready(st), f"kv ready {st.rid}")

    async def _kv_ready(self, st: MainState) -> None:
        """p-rld-md: tell RLD that MD holds the KV, or apply the router's batch
        (RLD died before MD had the KV: its token ids came from the router)."""
        if st.batches:
            await self._apply_batches(st)
            return
        prompt = st.request.prompt_token_ids
        try:
            rld = await self.peer(st.request.metadata["rld"])
        except ConnectionClosed:
            rld = None  # the router re-plans: RLD's tokens come back as a HANDOFF
        if rld is not None and st.rid in self.states:
            await rld.send(st.rid, KvReady(len(prompt)))
        await self._apply_batches(st)

    async def _apply_batches(self, st: MainState) -> None:
        async with st.lock:  # one batch at a time, in arrival order
            while st.batches and self.states.get(st.rid) is st:
                peer, msg = st.batches.pop(0)
                await self._apply_batch(st, peer, msg)

    async def _apply_batch(self, st: MainState, peer: Peer, msg: Handoff) -> None:
        h = st.handoff
        if h.final:
            return  # e.g. the router's re-sent tokens after RLD's own final batch
        new = h.plan(msg.start_position, msg.token_ids, msg.final)
        predicted = await self.decoder.extend(st.cache, new, urgent=msg.final) if new else None
        h.applied(new, predicted, msg.final)
        st.report["extend_tokens"] += len(new)
        st.report["handoff_batches"] += 1
        if self.states.get(st.rid) is not st:
            return
        if msg.final:
            st.report["handoff_tokens"] = h.next_position
            await self._start_decoding(st, h.next_position, h.next_token)
        else:
            await peer.send(st.rid, HandoffAck(msg.batch, h.next_position))
            self.protocol_event("handoff_acked", st.rid, batch=msg.batch)

    async def _start_decoding(self, st: MainState, position: int, token: int) -> None:
        """Emit ``token`` at ``position`` (MD's first token) and decode the rest."""
        max_out = st.request.max_output_tokens
        if position >= max_out:  # everything was emitted upstream
            await self._finish(st, position)
            return
        await self._send_router(st.rid, Tokens(Role.MAIN_DECODE, position, (token,)))
        if position + 1 >= max_out:
            await self._finish(st, position + 1)
            return
        st.seq = Seq(st.rid, st.cache, token, position + 1, max_out)
        self.decoder.join(st.seq)

    async def _on_tokens(self, emitted: list[Emitted]) -> None:
        for e in emitted:
            await self._send_router(e.seq.rid, Tokens(Role.MAIN_DECODE, e.position, (e.token_id,)))
            if e.finished and e.seq.rid in self.states:
                await self._finish(self.states[e.seq.rid], e.position + 1)

    async def _finish(self, st: MainState, n_tokens: int) -> None:
        await self._send_router(st.rid, Done(n_tokens, FinishReason.LENGTH))
        await self._free(st, {})

    async def _on_cancel(self, rid: int, st: MainState | None) -> None:
        self.cancelled.add(rid)
        self.early.pop(rid, None)
        if len(self.cancelled) > 100_000:
            self.cancelled.clear()  # a bound; very old ids never come back
        if st is not None:
            await self._free(st, {"cancelled": True})

    async def on_peer_lost(self, peer: Peer) -> None:
        if peer.role != Role.PREFILL:
            return
        for st in [s for s in self.states.values() if s.p_peer is peer and not s.kv_done]:
            await self._send_router(st.rid, Error(ErrorCode.UNAVAILABLE,
                                                  f"MAIN_DECODE: KV source {peer.name} lost"))
            await self._free(st, {"kv_lost": True})

    async def _send_router(self, rid: int, msg) -> None:
        if self.router is not None:
            await self.router.send(rid, msg)

    def _not_receiving(self, rid: int) -> None:
        self._receiving.discard(rid)
        if not self._receiving:
            self._busy_all_interval = False  # an idle moment: this interval is not busy

    async def _free(self, st: MainState, extra: dict) -> None:
        if self.states.pop(st.rid, None) is None:
            return
        st.kv_event.set()  # whoever waited for this prefix asks for it itself
        self._not_receiving(st.rid)
        self.decoder.leave(st.rid)
        h = st.handoff
        report = dict(st.report, **extra, handoff_mismatches=h.mismatches,
                      overruns=st.seq.overruns if st.seq else 0,
                      kv_wait_s=round(st.seq.kv_wait_s, 6) if st.seq else 0.0)
        await self._send_router(st.rid, Report(Role.MAIN_DECODE, self.name, report))
