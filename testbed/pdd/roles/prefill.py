"""The prefill role P (DC A): prefix-cached prefill, then dual-path KV transfer.

Request lifecycle at P (docs/pdd-roles.md, steps 3-4):

1. REQUEST from the router (metadata: pipeline, rld, md) joins a FIFO; one
   prefill runs at a time (the instance is compute-bound). A request the
   router left unbound (metadata ``bind: "late"``, no pipeline: it waited in
   this queue, docs/pdd-roles.md "Late binding") is bound when its prefill
   starts: P sends the router STARTED(hit tokens) and the router answers BIND
   with the pipeline, rld and md, which P merges into the metadata. The
   prefill runs meanwhile; the paths start once the BIND is in (the local one
   at once, the WAN one at the prefill's end, as below).
2. Prefill: match the prompt in P's prefix cache (RadixCache, block
   ``prefill.block_size``, values = per-block KV segments), run the tiny
   model on the missing suffix, pad to ``prefill_s(new, cached)`` on GPU_A
   (times ``time_scale``), insert the prompt's blocks. Token 0 = argmax of
   the last logits (P does not emit it). The model runs in a worker thread,
   so KV shipping (step 3) of earlier requests goes on meanwhile.
3. Two concurrent tasks ship the KV:
   - RLD path (p-rld-md, rld-only): REQUEST (+ token 0 in metadata
     ``token0``), KV_CHUNKs of [0, n) (RLD keeps no prefix cache, so it
     lacks the whole prompt), KV_DONE;
   - MD path (p-md, p-rld-md): REQUEST (+ token 0); wait for MD's
     KV_NEED(start); KV_CHUNKs of [start, n); KV_DONE.
   Chunks are ``kvpayload`` chunks of modeled size (real KV bytes + filler).
   Layer-wise local path (``prefill.layerwise_local``, on by default): the
   RLD path starts when the prefill starts, as RDMA KV transfer engines do
   (layer by layer while the model computes): the KV of P's cached prefix
   is there at once, the new tokens' KV becomes available in proportion to
   the modeled prefill time elapsed, so a chunk [s, e) leaves no earlier
   than ``start + prefill x (e - hit) / (n - hit)``; KV_DONE leaves once the
   prefill has ended (RLD emits token 0 then, never before). The WAN path
   to MD starts after the prefill, as in the paper and its baseline.
4. When both paths are done (or failed): REPORT to the router. A path that
   fails sends ERROR(UNAVAILABLE, "<ROLE>: why") to the router, naming the
   path's role so the router can fail or re-plan only that path.

CANCEL from the router drops the request (queued or shipping); a KV_NEED
for a request P no longer holds is answered with CANCEL.

TCP status (the router's measure of WAN loss): every
``prefill.tcp_status_interval_s`` P sends the router a REPORT with request id
0, a ``TcpStatus`` (testbed/pdd/wire/status.py): the segments its
connections to MD sent and retransmitted in the interval (the kernel's
TCP_INFO, summed over those connections) and the largest current
retransmission timeout. Nothing is sent while no segment left; nothing at
all on a transport without TCP (the in-process one).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from testbed import clock
from testbed.pdd.run.config import ClusterConfig
from testbed.types import Pipeline
from testbed.pdd.compute.decoder import warm_model
from testbed.pdd.wire.kvpayload import chunk_frame_bytes, kv_chunk
from testbed.pdd.compute.engine import Cache, argmax
from testbed.pdd.compute.pacing import AsyncPacer
from testbed.pdd.roles.peers import Peer, RoleServer
from testbed.pdd.wire.protocol import (Bind, Cancel, Error, ErrorCode, Frame, KvDone, KvNeed,
                                       Report, Request, Role, Started)
from testbed.pdd.compute.radix import RadixCache
from testbed.pdd.wire.transport import ConnectionClosed, TcpCounters, Transport
from testbed.pdd.wire.status import TcpStatus


@dataclass(eq=False)
class PrefillJob:
    """One request at P, from REQUEST to REPORT."""

    rid: int
    request: Request
    t_queued: float
    cache: Cache | None = None
    token0: int = -1
    need: asyncio.Future | None = None  # MD's KV_NEED start
    cancelled: bool = False
    md_cancelled: bool = False  # MD dropped the request: stop the WAN path quietly
    report: dict = field(default_factory=lambda: {"kv_overrun_bytes": 0})
    t_start: float = 0.0  # prefill start (monotonic)
    t_end_est: float = 0.0  # when the modeled prefill will end
    hit: int = 0  # tokens P's prefix cache held
    prefilled: asyncio.Event = field(default_factory=asyncio.Event)  # the prefill ended
    early: asyncio.Task | None = None  # the layer-wise local path, started with the prefill
    bound: asyncio.Future | None = None  # a late-bound request's BIND (None: bound at REQUEST)

    @property
    def pipeline(self) -> Pipeline:
        return Pipeline(self.request.metadata["pipeline"])


def block_segments(cache: Cache, n_tokens: int, block_size: int) -> list[Cache]:
    """Per-block KV segments of the whole blocks of positions [0, n_tokens)."""
    return [cache.slice(i, i + block_size)
            for i in range(0, n_tokens // block_size * block_size, block_size)]


def cache_from_blocks(model, blocks: tuple[Cache, ...], capacity: int = 0) -> Cache:
    """A cache starting at 0 made of consecutive block segments (a radix match's values),
    with room for ``capacity`` tokens."""
    cache = model.new_cache(capacity)
    for seg in blocks:
        cache.append(seg)
    return cache


class PrefillNode(RoleServer):
    """P: see the module docstring. Example: ``await PrefillNode(cfg, "p0", transport).start()``."""

    ROLE = Role.PREFILL

    def __init__(self, cfg: ClusterConfig, name: str, transport: Transport):
        super().__init__(cfg, name, transport)
        self.model = warm_model(cfg.model)
        self.cost = cfg.timing.cost(Role.PREFILL)
        self.pacer = AsyncPacer(cfg.timing.time_scale)
        self.prefix = RadixCache(cfg.prefill.block_size, cfg.prefill.cache_capacity_tokens)
        self.jobs: dict[int, PrefillJob] = {}
        self._queue: asyncio.Queue[PrefillJob] = asyncio.Queue()

    async def on_start(self) -> None:
        self.spawn(self._prefill_worker(), "prefill worker")
        self.warm([i.name for role in (Role.RELAY_DECODE, Role.MAIN_DECODE)
                   for i in self.cfg.of_role(role)])
        self.spawn(self._tcp_status_loop(), "tcp status")

    async def _tcp_status_loop(self) -> None:
        interval = self.cfg.prefill.tcp_status_interval_s
        marks: dict[int, TcpCounters] = {}  # by id(connection): the counters last reported
        t_last = clock.now()
        while True:
            await asyncio.sleep(interval)
            now = clock.now()
            segs = retrans = 0
            rto = 0.0
            current = {}
            for name in [i.name for i in self.cfg.of_role(Role.MAIN_DECODE)]:
                peer = self.connected(name)
                counters = peer.conn.tcp_counters() if peer is not None else None
                if counters is None:
                    continue
                key = id(peer.conn)
                current[key] = counters
                last = marks.get(key, TcpCounters(0, 0, 0.0))
                if counters.segs_out < last.segs_out or counters.total_retrans < last.total_retrans:
                    last = TcpCounters(0, 0, 0.0)  # a new connection where an old one was
                segs += counters.segs_out - last.segs_out
                retrans += counters.total_retrans - last.total_retrans
                rto = max(rto, counters.rto_s)
            marks = current
            if segs > 0:
                await self.report_status(TcpStatus(now - t_last, segs, retrans, rto).data())
            t_last = now

    def held(self) -> dict:
        return self.jobs

    async def on_frame(self, peer: Peer, frame: Frame) -> None:
        rid, msg = frame.request_id, frame.message
        job = self.jobs.get(rid)
        if peer.role == Role.ROUTER:
            if isinstance(msg, Request) and job is not None:
                self.stray(peer, frame, "a second REQUEST for a request P holds")
            elif isinstance(msg, Request):
                job = PrefillJob(rid, msg, clock.now())
                if msg.metadata.get("bind") == "late":
                    job.bound = asyncio.get_running_loop().create_future()
                self.jobs[rid] = job
                self._queue.put_nowait(job)
            elif isinstance(msg, Bind) and job is not None and job.bound is not None \
                    and not job.bound.done():
                req = job.request
                job.request = Request(req.prompt_token_ids, req.max_output_tokens,
                                      {**{k: v for k, v in req.metadata.items() if k != "bind"},
                                       **msg.metadata})
                job.bound.set_result(None)
            elif isinstance(msg, Bind):
                self.stray(peer, frame, "a BIND for a request P does not hold unbound")
            elif isinstance(msg, Cancel) and job is not None:
                job.cancelled = True
                for waiting in (job.need, job.bound):
                    if waiting is not None and not waiting.done():
                        waiting.cancel()
        elif isinstance(msg, Cancel) and job is not None and peer.role == Role.MAIN_DECODE:
            job.md_cancelled = True
            if job.need is not None and not job.need.done():
                job.need.cancel()
        elif isinstance(msg, KvNeed):
            if job is None:
                self.stray(peer, frame)
            if job is None or job.cancelled or job.need is None:
                await peer.send(rid, Cancel())
            elif not job.need.done():
                job.need.set_result(msg.start)

    async def on_peer_lost(self, peer: Peer) -> None:
        if peer.role == Role.MAIN_DECODE:
            for job in self.jobs.values():
                if job.request.metadata.get("md") == peer.name and job.need is not None \
                        and not job.need.done():
                    job.need.set_exception(ConnectionClosed(f"{peer.name} closed"))

    async def _prefill_worker(self) -> None:
        while True:
            job = await self._queue.get()
            if job.cancelled:
                self._finish(job, {"cancelled": True})
                continue
            try:
                await self._prefill(job)
            except ValueError as err:  # e.g. ids outside the vocabulary: fail this request only
                if self.router is not None:
                    await self.router.send(job.rid, Error(ErrorCode.INTERNAL, f"prefill: {err}"))
                self._finish(job, {"error": str(err)})
                continue
            self.spawn(self._ship(job), f"ship {job.rid}")

    async def _prefill(self, job: PrefillJob) -> None:
        prompt = job.request.prompt_token_ids
        t_start = clock.now()
        hit = self.prefix.match(prompt)
        if job.bound is not None and self.router is not None:
            await self.router.send(job.rid, Started(hit.n_tokens))
        cache = cache_from_blocks(self.model, hit.values, len(prompt))
        # In a worker thread (torch releases the GIL while it computes): the loop keeps
        # shipping earlier requests' KV meanwhile, instead of stalling their transfers
        # for a whole prefill once the kernel's socket buffer has drained.
        logits, cache = await asyncio.to_thread(self.model.prefill, prompt, cache)
        bs = self.cfg.prefill.block_size
        self.prefix.insert(prompt, block_segments(cache, len(prompt), bs))
        real_s = clock.now() - t_start
        modeled_s = self.cost.prefill_s(len(prompt) - hit.n_tokens, hit.n_tokens)
        job.cache, job.token0 = cache, argmax(logits)
        job.t_start, job.hit = t_start, hit.n_tokens
        job.t_end_est = t_start + max(real_s, modeled_s * self.pacer.time_scale)
        if self.cfg.prefill.layerwise_local:
            job.early = self.spawn(self._early_local(job), f"local {job.rid}")
        overrun = await self.pacer.pad(modeled_s, real_s)
        job.report.update(p_hit_rate=hit.n_tokens / len(prompt), hit_tokens=hit.n_tokens,
                          prompt_len=len(prompt), queue_s=t_start - job.t_queued,
                          prefill_real_s=real_s,
                          prefill_modeled_s=modeled_s * self.pacer.time_scale,
                          overruns=int(overrun),
                          p_cache_hit_rate=self.prefix.stats.hit_rate,
                          t_prefill_end=clock.now())
        job.prefilled.set()

    async def _bound(self, job: PrefillJob) -> bool:
        """Wait for a late-bound job's BIND; False if the job was cancelled first."""
        if job.bound is None:
            return True
        try:
            await job.bound
        except asyncio.CancelledError:
            if job.cancelled:
                return False
            raise
        return True

    async def _early_local(self, job: PrefillJob) -> None:
        """The layer-wise local path, from the prefill's start (once bound), if the
        pipeline has RLD."""
        if await self._bound(job) and job.pipeline in (Pipeline.P_RLD_MD, Pipeline.RLD_ONLY):
            await self._ship_path(job, Role.RELAY_DECODE)

    async def _ship(self, job: PrefillJob) -> None:
        if not await self._bound(job):
            if job.early is not None:
                await job.early
            self._finish(job, {"cancelled": True})
            return
        paths = []
        if job.early is not None:
            paths.append(job.early)
        elif job.pipeline in (Pipeline.P_RLD_MD, Pipeline.RLD_ONLY):
            paths.append(self._ship_path(job, Role.RELAY_DECODE))
        if job.pipeline in (Pipeline.P_RLD_MD, Pipeline.P_MD):
            paths.append(self._ship_path(job, Role.MAIN_DECODE))
        await asyncio.gather(*paths)
        self._finish(job, {"cancelled": job.cancelled})

    async def _ship_path(self, job: PrefillJob, role: Role) -> None:
        key = "rld" if role == Role.RELAY_DECODE else "md"
        try:
            peer = await self.peer(job.request.metadata[key])
            meta = dict(job.request.metadata, token0=job.token0)
            req = Request(job.request.prompt_token_ids, job.request.max_output_tokens, meta)
            if role == Role.MAIN_DECODE:
                job.need = asyncio.get_running_loop().create_future()
            if not await peer.send(job.rid, req):
                raise ConnectionClosed(f"{peer.name} closed")
            start = 0 if role == Role.RELAY_DECODE else await job.need
            sent = await self._send_kv(job, peer, start)
            job.report[f"kv_{'intra' if key == 'rld' else 'wan'}_bytes"] = sent
            if key == "md":
                job.report["md_need_start"] = start
        except asyncio.CancelledError:
            if not (job.cancelled or job.md_cancelled):
                raise
        except ConnectionClosed as err:
            if not job.cancelled and self.router is not None:
                await self.router.send(job.rid, Error(ErrorCode.UNAVAILABLE,
                                                      f"{role.name}: {err}"))

    async def _send_kv(self, job: PrefillJob, peer: Peer, start: int) -> int:
        """KV_CHUNKs of [start, n) then KV_DONE; return the KV_CHUNK bytes sent."""
        n, step = len(job.request.prompt_token_ids), self.cfg.prefill.kv_chunk_tokens
        sent = chunks = 0
        half = start + (n - start) / 2  # the WAN transfer's midpoint, in tokens
        for s in range(start, n, step):
            if job.cancelled or (job.md_cancelled and peer.role == Role.MAIN_DECODE):
                return sent
            e = min(n, s + step)
            if job.early is not None and peer.role == Role.RELAY_DECODE:
                await _until(self._release_s(job, e))
            chunk, overrun = kv_chunk(job.cache, s, e, self.cfg.timing.modeled_kv_bytes(e - s))
            job.report["kv_overrun_bytes"] += overrun
            if not await peer.send(job.rid, chunk):
                raise ConnectionClosed(f"{peer.name} closed")
            sent += chunk_frame_bytes(chunk)
            chunks += 1
            if peer.role == Role.MAIN_DECODE and s < half <= e:
                self.protocol_event("kv_transfer_half", job.rid, tokens=e - start,
                                    of_tokens=n - start)
            await asyncio.sleep(0)  # let the other path and other roles run
        await job.prefilled.wait()  # token 0 exists once the prefill has ended
        if not await peer.send(job.rid, KvDone(n, sent, chunks)):
            raise ConnectionClosed(f"{peer.name} closed")
        return sent

    @staticmethod
    def _release_s(job: PrefillJob, end: int) -> float:
        """When the KV of positions [.., end) exists (layer-wise: the cached prefix at
        once, the new tokens' in proportion to the prefill time elapsed)."""
        n = len(job.request.prompt_token_ids)
        if end <= job.hit or n <= job.hit:
            return job.t_start
        return job.t_start + (job.t_end_est - job.t_start) * (end - job.hit) / (n - job.hit)

    def _finish(self, job: PrefillJob, extra: dict) -> None:
        self.jobs.pop(job.rid, None)
        job.cache = None
        if self.router is not None:
            report = Report(Role.PREFILL, self.name, dict(job.report, **extra))
            self.spawn(self.router.send(job.rid, report), f"report {job.rid}")


async def _until(t: float) -> None:
    """Sleep until monotonic time ``t`` (no-op if it has passed)."""
    delay = t - clock.now()
    if delay > 0:
        await asyncio.sleep(delay)
