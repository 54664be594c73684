"""Continuous-batching decode loop shared by RLD and MD.

Owns the active sequences of one decode instance and the step loop. Every
step decodes one token for each active sequence (real tiny-model compute,
one ``decode_step`` per sequence) and runs every queued ``extend`` (MD's
recompute of handed-over token ids) in the same step -- except that a step
with an ``urgent`` extend queued (a final handoff batch: the client waits for
it) takes only the urgent ones and leaves the rest (catch-up's earlier
batches, while RLD still decodes) to the next step, and a non-urgent extend
runs at most ``chunk_tokens`` tokens per step (the rest in the next steps;
its future resolves after the last chunk); the step is then
padded to the cost model's time for the whole pass (``CostModel.pass_s``
of ``(1, context)`` per sequence plus ``(n, context)`` per extend, times
``time_scale``). Tokens exist only once the step's modeled time is over:
then they are handed to the role's ``sink`` in one call.

KV memory: a sequence holds, from the step it joins to the one it leaves,
the modeled KV of its whole life (``footprint``: its prompt x token_scale
plus its max output, the router's RLD budget's count), against the
instance's modeled KV memory (``CostModel.kv_capacity_tokens``: usable
device memory minus the weights). One that does not fit waits, first come
first served, until enough of it is free: a real engine's scheduler queues
such a request (vLLM's waiting queue; reserving the whole life up front
means nothing is ever preempted). A sequence larger than the memory alone
runs when nothing else does. ``kv_wait_s`` on the Seq is how long it waited;
``max_waiting`` the most that waited at once. Extends (MD's recompute) run on
caches that have not joined and are not counted.

Sequence lifecycle: ``join(seq)`` (the role has emitted ``seq.next_token``
at ``seq.next_position - 1``) -> each step produces ``next_position`` ->
the loop drops the sequence itself after producing position
``max_out - 1`` (``finished`` is True in the sink) -> or the role calls
``leave(rid)`` at any time; a token computed for a sequence that left
during the step is discarded, never emitted.

Example::

    loop = DecodeLoop(model, CostModel(GPU_B), AsyncPacer(0.5), sink)
    loop.start()
    loop.join(Seq(rid=7, cache=cache, next_token=t0, next_position=1, max_out=32))
    tok = await loop.extend(cache, (5, 9, 11))   # argmax after the three ids
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from testbed import clock
from testbed.pdd.compute.costmodel import CostModel
from testbed.pdd.compute.engine import Cache, Model, ModelConfig, argmax, build_model
from testbed.pdd.compute.pacing import AsyncPacer

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Seq:
    """One request being decoded; ``next_token`` is fed to produce ``next_position``."""

    rid: int
    cache: Cache
    next_token: int
    next_position: int
    max_out: int
    overruns: int = 0  # steps of this sequence whose real compute exceeded the modeled time
    kv_wait_s: float = 0.0  # time waited for KV memory before it decoded (module docstring)
    t_joined: float = 0.0


@dataclass(frozen=True)
class Emitted:
    """A token a step produced: ``finished`` when it was the sequence's last position."""

    seq: Seq
    position: int
    token_id: int
    finished: bool


Sink = Callable[[list[Emitted]], Awaitable[None]]


@dataclass(eq=False)
class _ExtendJob:
    cache: Cache
    token_ids: tuple[int, ...]
    future: asyncio.Future
    urgent: bool = False


class DecodeLoop:
    """The step loop of one decode instance (see the module docstring)."""

    def __init__(self, model: Model, cost: CostModel, pacer: AsyncPacer, sink: Sink,
                 chunk_tokens: int = 0, kv_capacity_tokens: int | None = None):
        self.model, self.cost, self.pacer, self._sink = model, cost, pacer, sink
        self.chunk_tokens = chunk_tokens  # 0: non-urgent extends run whole
        self.kv_capacity = cost.kv_capacity_tokens() if kv_capacity_tokens is None \
            else kv_capacity_tokens
        self.active: dict[int, Seq] = {}
        self.waiting: dict[int, Seq] = {}  # for KV memory, in arrival order
        self._reserved: dict[int, int] = {}  # rid -> modeled KV tokens (footprint)
        self.kv_held = 0
        self.max_waiting = 0
        self._extends: list[_ExtendJob] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.n_steps = 0
        self.max_batch = 0

    @property
    def load(self) -> int:
        """Sequences on this instance: decoding or waiting for KV memory."""
        return len(self.active) + len(self.waiting)

    def holds(self, rid: int) -> bool:
        return rid in self.active or rid in self.waiting

    def footprint(self, seq: Seq) -> int:
        """Modeled KV tokens ``seq`` holds over its life: its prompt (the cache less the
        tokens decoded before it joined) x token_scale, plus its max output."""
        prompt = max(0, seq.cache.length - (seq.next_position - 1))
        return prompt * self.cost.token_scale + seq.max_out

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(_log_crash)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for job in self._extends:
            job.future.cancel()

    def join(self, seq: Seq) -> None:
        if self.holds(seq.rid):
            raise ValueError(f"request {seq.rid} is already decoding")
        if seq.next_position >= seq.max_out:
            raise ValueError(f"request {seq.rid} has nothing left to decode")
        seq.t_joined = clock.now()
        self.waiting[seq.rid] = seq
        self._admit()

    def leave(self, rid: int) -> Seq | None:
        seq = self.active.pop(rid, None) or self.waiting.pop(rid, None)
        self._release(rid)
        return seq

    def _release(self, rid: int) -> None:
        self.kv_held -= self._reserved.pop(rid, 0)
        self._admit()

    def _admit(self) -> None:
        """Start the waiting sequences, first come first served, while their KV fits."""
        while self.waiting:
            rid, seq = next(iter(self.waiting.items()))
            need = self.footprint(seq)
            if self.active and self.kv_held + need > self.kv_capacity:
                break
            del self.waiting[rid]
            self._reserved[rid] = need
            self.kv_held += need
            seq.kv_wait_s += clock.now() - seq.t_joined
            self.active[rid] = seq
            self._wake.set()
        self.max_waiting = max(self.max_waiting, len(self.waiting))

    def extend(self, cache: Cache, token_ids: tuple[int, ...],
               urgent: bool = False) -> asyncio.Future:
        """Queue an extend pass for the next step (the next one with only urgent extends if
        any is urgent, see the module docstring); the future gives the argmax after it."""
        if not token_ids:
            raise ValueError("extend needs at least one token id")
        fut = asyncio.get_running_loop().create_future()
        self._extends.append(_ExtendJob(cache, tuple(token_ids), fut, urgent))
        self._wake.set()
        return fut

    def _take_extends(self) -> list[tuple[_ExtendJob, tuple[int, ...], bool]]:
        """This step's extends as (job, token ids, last part): the urgent ones if any, else
        all, a non-urgent one cut to ``chunk_tokens`` (its rest stays queued, first)."""
        jobs = self._extends
        if any(j.urgent for j in jobs):
            self._extends = [j for j in jobs if not j.urgent]
            return [(j, j.token_ids, True) for j in jobs if j.urgent]
        self._extends, parts, rest = [], [], []
        for j in jobs:
            n = self.chunk_tokens
            if n and len(j.token_ids) > n:
                parts.append((j, j.token_ids[:n], False))
                j.token_ids = j.token_ids[n:]
                rest.append(j)
            else:
                parts.append((j, j.token_ids, True))
        self._extends = rest
        return parts

    async def _run(self) -> None:
        while True:
            if not self.active and not self._extends:
                self._wake.clear()
                await self._wake.wait()
            await self._step()

    async def _step(self) -> None:
        seqs, parts = list(self.active.values()), self._take_extends()
        segments = [(1, s.cache.length) for s in seqs]
        segments += [(len(ids), j.cache.length) for j, ids, _ in parts]
        t0 = clock.now()
        tokens = [argmax(self.model.decode_step(s.cache, s.next_token)) for s in seqs]
        predicted = [argmax(self.model.extend(j.cache, ids)) for j, ids, _ in parts]
        overrun = await self.pacer.pad(self.cost.pass_s(segments), clock.now() - t0)
        self.n_steps += 1
        self.max_batch = max(self.max_batch, len(seqs))
        for (job, _, last), tok in zip(parts, predicted):
            if last and not job.future.done():
                job.future.set_result(tok)
        out = []
        for seq, tok in zip(seqs, tokens):
            if self.active.get(seq.rid) is not seq:
                continue  # left during the step: this token never existed
            seq.overruns += overrun
            position = seq.next_position
            seq.next_token, seq.next_position = tok, position + 1
            finished = seq.next_position >= seq.max_out
            if finished:
                del self.active[seq.rid]
                self._release(seq.rid)
            out.append(Emitted(seq, position, tok, finished))
        if out:
            await self._sink(out)


def warm_model(cfg: ModelConfig) -> Model:
    """Build the model of ``cfg.engine`` and run each kind of pass once, so the first request
    does not pay torch's lazy initialisation (tens of ms) inside its TTFT."""
    model = build_model(cfg)
    _, cache = model.prefill([0] * 20)
    model.decode_step(cache, 1)
    model.extend(cache, [2, 3])
    return model


def _log_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("decode loop crashed", exc_info=task.exception())
