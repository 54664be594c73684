"""The relay decode role RLD (DC A, next to P): eager tokens, then token-ID handoff.

Request lifecycle at RLD (docs/pdd-roles.md, step 7):

1. REQUEST (+ token 0) and KV_CHUNKs from P assemble the prompt's KV; on
   KV_DONE RLD emits token 0 at once (TOKENS to the router, producer RLD)
   and the request joins RLD's continuous batch (``DecodeLoop``, GPU_A).
2. Each step's token goes to the router at once: these are the eager tokens.
3. ``p-rld-md``: MD's KV_READY starts the handoff (``handoff.RelayHandoff``
   decides batches): HANDOFF frames carry token ids only; HANDOFF_ACKs from
   MD drive catch-up. After the final batch RLD stops decoding the request
   at once and frees it.
4. RLD emits the last token itself (``rld-only``, or a ``p-rld-md`` request
   that ends before MD is level): DONE to the router (which cancels MD).
5. MD lost (its connection to RLD closed, a HANDOFF could not be sent, or the
   router's ERROR(UNAVAILABLE) for the request) before the final batch: RLD
   decodes the request to its end; the pipeline becomes ``p-rld-md->rld``.

KV_READY may arrive before RLD has emitted anything (even before P's
REQUEST): the state is then created by KV_READY, the final batch is empty,
and RLD never emits for that request. Every request RLD knew ends with one
REPORT to the router when RLD frees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed import clock
from testbed.pdd.run.config import ClusterConfig
from testbed.types import Pipeline
from testbed.pdd.compute.decoder import Emitted, Seq
from testbed.pdd.roles.handoff import HandoffBatch, RelayHandoff, RelayPhase
from testbed.pdd.compute.engine import Cache
from testbed.pdd.roles.decoding import DecodingRoleServer
from testbed.pdd.roles.peers import Peer, frame_bytes
from testbed.pdd.wire.protocol import (Cancel, Done, Error, ErrorCode, FinishReason, Frame, Handoff,
                                  HandoffAck, Health, HealthAck, KvChunk, KvDone, KvReady,
                                  ProtocolError, Report, Request, Role, Tokens)
from testbed.pdd.wire.transport import Transport


@dataclass(eq=False)
class RelayState:
    """One request at RLD, from the first frame about it to its REPORT."""

    rid: int
    handoff: RelayHandoff
    request: Request | None = None
    cache: Cache | None = None
    tokens: list[int] = field(default_factory=list)  # emitted ids, position = index
    md_peer: Peer | None = None
    seq: Seq | None = None
    t_first: float = field(default_factory=clock.now)
    report: dict = field(default_factory=lambda: {"kv_intra_bytes": 0, "handoff_bytes": 0})

    @property
    def pipeline(self) -> Pipeline | None:
        return Pipeline(self.request.metadata["pipeline"]) if self.request else None


class RelayDecodeNode(DecodingRoleServer):
    """RLD: see the module docstring."""

    ROLE = Role.RELAY_DECODE

    def __init__(self, cfg: ClusterConfig, name: str, transport: Transport):
        super().__init__(cfg, name, transport)
        self.states: dict[int, RelayState] = {}
        self.ended: set[int] = set()  # ids freed or cancelled: later frames are ignored

    def held(self) -> dict:
        return self.states

    def _state(self, rid: int) -> RelayState:
        if rid not in self.states:
            r = self.cfg.relay
            self.states[rid] = RelayState(rid, RelayHandoff(
                r.handoff_mode, r.catchup_threshold_tokens, r.catchup_max_batches))
        return self.states[rid]

    async def on_frame(self, peer: Peer, frame: Frame) -> None:
        rid, msg = frame.request_id, frame.message
        if peer.role == Role.ROUTER:
            await self._from_router(peer, rid, msg)
        elif peer.role == Role.PREFILL:
            await self._from_prefill(peer, rid, msg)
        elif peer.role == Role.MAIN_DECODE:
            await self._from_md(peer, rid, msg)

    async def _from_router(self, peer: Peer, rid: int, msg) -> None:
        st = self.states.get(rid)
        if isinstance(msg, Health):
            await peer.send(rid, HealthAck(msg.nonce, self.decoder.load, len(self.states)))
        elif isinstance(msg, Cancel):
            self._mark_ended(rid)
            if st is not None:
                await self._free(st, {"cancelled": True})
        elif isinstance(msg, Error):  # the router says MD's path failed
            if st is None:
                await peer.send(rid, Error(ErrorCode.UNKNOWN_REQUEST, "RLD already freed it"))
            else:
                await self._md_lost(st, msg.reason)

    async def _from_prefill(self, peer: Peer, rid: int, msg) -> None:
        if rid in self.ended:
            return
        if isinstance(msg, Request):
            st = self._state(rid)
            st.request = msg  # room for the prompt's KV and every token RLD may decode
            st.cache = self.model.new_cache(len(msg.prompt_token_ids) + msg.max_output_tokens)
            return
        st = self.states.get(rid)
        if st is None:
            self.stray(peer, Frame(rid, msg))
            return
        if st.request is None:
            return  # cancelled meanwhile
        if isinstance(msg, KvChunk):
            st.report["kv_intra_bytes"] += self.take_chunk(st.cache, msg)
        elif isinstance(msg, KvDone):
            await self._kv_done(st, msg)

    async def _kv_done(self, st: RelayState, msg: KvDone) -> None:
        prompt = st.request.prompt_token_ids
        if st.cache.length != len(prompt) or msg.num_tokens != len(prompt):
            raise ProtocolError(f"KV_DONE for {msg.num_tokens} tokens, RLD holds "
                                f"{st.cache.length} of a {len(prompt)}-token prompt")
        st.report["kv_wait_s"] = clock.now() - st.t_first
        if not st.handoff.decoding:  # handed over before RLD had anything to emit
            await self._free(st, {})
            return
        token0 = int(st.request.metadata["token0"])
        await self._emit(st, [Emitted(None, 0, token0, st.request.max_output_tokens == 1)])
        if st.handoff.decoding:
            st.seq = Seq(st.rid, st.cache, token0, 1, st.request.max_output_tokens)
            self.decoder.join(st.seq)

    async def _from_md(self, peer: Peer, rid: int, msg) -> None:
        if rid in self.ended:  # RLD finished it (or it was cancelled): MD can drop it now
            if isinstance(msg, KvReady):
                await peer.send(rid, Cancel())
        elif isinstance(msg, KvReady):
            if rid not in self.states and len(self.states) >= self.cfg.limits.max_requests:
                self.stray(peer, Frame(rid, msg), "limits.max_requests reached")
                return
            st = self._state(rid)
            st.md_peer = peer
            st.report["t_kv_ready_rel_s"] = clock.now() - st.t_first
            await self._send_batch(st, st.handoff.on_kv_ready())
        elif isinstance(msg, HandoffAck) and rid in self.states:
            st = self.states[rid]
            await self._send_batch(st, st.handoff.on_ack(msg.batch, msg.next_position))
        else:
            self.stray(peer, Frame(rid, msg))

    async def on_peer_lost(self, peer: Peer) -> None:
        if peer.role == Role.MAIN_DECODE:
            for st in list(self.states.values()):  # rld-only requests never needed MD
                if st.md_peer is peer or (st.pipeline == Pipeline.P_RLD_MD and
                                          st.request.metadata.get("md") == peer.name):
                    await self._md_lost(st, f"connection to {peer.name} lost")

    async def _send_batch(self, st: RelayState, batch: HandoffBatch | None) -> None:
        if batch is None:
            return
        msg = Handoff(batch.batch, batch.start, tuple(st.tokens[batch.start: batch.end]),
                      batch.final)
        st.report["handoff_bytes"] += frame_bytes(msg)
        if batch.final:
            self.decoder.leave(st.rid)  # at once: no token after the final batch's end
        if not await st.md_peer.send(st.rid, msg):
            await self._md_lost(st, "HANDOFF could not be sent")
            return
        self.protocol_event("handoff_sent", st.rid, batch=batch.batch, start=batch.start,
                            tokens=batch.end - batch.start, final=batch.final)
        if batch.final:
            self.protocol_event("handoff_final", st.rid, batch=batch.batch)
        if batch.final:
            await self._free(st, {})

    async def _md_lost(self, st: RelayState, why: str) -> None:
        """MD is gone before the final batch went out: RLD decodes to the end."""
        if self.states.get(st.rid) is not st or not st.handoff.on_md_lost():
            return
        st.report["md_lost"] = why
        seq = st.seq
        if seq is None or self.decoder.holds(st.rid):
            return  # not decoding yet (KV_DONE will start it) or still decoding
        # Resume after the last emitted token: a step that was running when RLD
        # left the batch may have fed one more token into the cache.
        seq.cache.truncate(len(st.request.prompt_token_ids) + len(st.tokens) - 1)
        seq.next_token, seq.next_position = st.tokens[-1], len(st.tokens)
        self.decoder.join(seq)

    async def _on_tokens(self, emitted: list[Emitted]) -> None:
        for e in emitted:
            st = self.states.get(e.seq.rid)
            if st is not None and st.handoff.decoding:
                await self._emit(st, [e])

    async def _emit(self, st: RelayState, emitted: list[Emitted]) -> None:
        """Send tokens to the router; update the handoff; finish if the last one went."""
        for e in emitted:
            st.tokens.append(e.token_id)
            if e.position != len(st.tokens) - 1:
                raise AssertionError(f"RLD emitted {e.position} after {len(st.tokens) - 1}")
        st.handoff.on_emitted(len(st.tokens))
        first = emitted[0].position
        if first == 0:  # relay overhead: P's t_prefill_end -> this (client_record)
            st.report["t_first_token"] = clock.now()
        if self.router is not None:
            await self.router.send(st.rid, Tokens(Role.RELAY_DECODE, first,
                                                  tuple(e.token_id for e in emitted)))
        if emitted[-1].finished:
            st.handoff.on_finished()
            self.decoder.leave(st.rid)
            if self.router is not None:
                await self.router.send(st.rid, Done(len(st.tokens), FinishReason.LENGTH))
            await self._free(st, {})

    def _mark_ended(self, rid: int) -> None:
        self.ended.add(rid)
        if len(self.ended) > 100_000:
            self.ended.clear()  # a bound; very old ids never come back

    async def _free(self, st: RelayState, extra: dict) -> None:
        if self.states.pop(st.rid, None) is None:
            return
        self._mark_ended(st.rid)
        self.decoder.leave(st.rid)
        h = st.handoff
        pipeline = st.pipeline.value if st.pipeline else None
        report = dict(st.report, **extra, eager_tokens=len(st.tokens), phase=h.phase.value,
                      pipeline_final=(pipeline or "") + h.pipeline_suffix,
                      handoff_batches=[[b.start, b.end, b.final] for b in h.batches],
                      handoff_tokens=h.sent_end if h.phase == RelayPhase.HANDED_OVER else 0,
                      overruns=st.seq.overruns if st.seq else 0,
                      kv_wait_s=round(st.seq.kv_wait_s, 6) if st.seq else 0.0)
        if self.router is not None:
            await self.router.send(st.rid, Report(Role.RELAY_DECODE, self.name, report))
