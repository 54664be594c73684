"""The router role (DC A): routes client requests, forwards results, handles role loss.

Lifecycle: ``start()`` listens for clients and connects to every P, RLD and
MD instance of the config (each role learns the router from that HELLO and
sends TOKENS, DONE, ERROR and REPORT back on it). Per request:

1. client REQUEST(prompt, max_out, {id, session}) -> a router request id;
   its instances (``_choose``, every mode alike, by what each costs the
   request: ``policy.base.default_placement``): the P whose prefill would
   end first (its queue plus what its prefix mirror lacks); the MD whose
   transfer of what its DRC mirror (or its in-flight KV) lacks (counted once
   more per transfer sharing the line) plus the request's decode in its batch
   is least; the RLD whose decode is least.
   Then P's expected hit and the chosen MD's expected DRC hit from the
   router's prefix mirrors; P's expected prefill end (its FIFO queue, modeled
   prefill times); the WAN time predicted by ``wan_model.WanModel`` for
   what MD lacks, behind the KV already committed to the WAN; RLD's room
   (``routing.RldBudget``); the policy (``router.policy``, by default the
   mode's own: ``testbed/pdd/policy/``) picks the pipeline.
   The router REPORTs the decision with every input and the prediction to
   the client (the decision record, ``testbed.decision.Decision``: ``pipeline``,
   ``reason``, ``roles``, and its ``Routing``: ``t_route``, ``predicted_wan_s``,
   ``predicted_kv_at_md_s``, backlog, capacity, RTT, RLD load) and sends P
   the REQUEST with metadata {pipeline, rld, md}. Late binding: a request
   that would wait in P's queue gets only its P on arrival (REQUEST with
   {bind: "late"}); the rest of this step runs when P's STARTED says its
   prefill starts, and P gets BIND({pipeline, rld, md}) (``_queue_unbound``,
   ``_bind_late``; docs/pdd-roles.md, message flow step 2).
2. TOKENS, DONE, ERROR and REPORT from the roles are forwarded to the client
   under the client's request id. The router keeps every token id RLD
   emitted (for RLD loss), counts RLD's live requests and their modeled KV
   tokens (+ when routed, - at RLD's REPORT, which RLD sends when it frees
   the request). The WAN model (one for the line every P shares) is fed by
   the MDs' WAN status (request id 0, every ``main.wan_status_interval_s``:
   KV bytes received, busy or not, what each transfer still misses; the
   capacity sample sums every MD's recent rate), by the router's HEALTH probes to each
   MD (RTT), and by the end of each transfer (MD's first token or REPORT).
3. At DONE (or a failure) every role of the pipeline gets CANCEL (roles
   ignore ids they no longer hold), so P stops a useless WAN transfer and MD
   drops a request RLD finished.

Failure semantics (docs/pdd-roles.md): MD path lost (MD's connection, or an
ERROR naming MAIN_DECODE) before MD emitted anything in ``p-rld-md`` ->
ERROR(UNAVAILABLE) to RLD, which finishes the request itself; otherwise the
request fails. RLD lost in ``p-rld-md`` before its final batch -> MD gets a
final HANDOFF (batch ``RECOVERY_BATCH``) with the token ids RLD emitted;
``rld-only`` -> fails. P lost before any token -> fails. Every failure is an
ERROR to the client with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from dataclasses import dataclass, field
from typing import Sequence

from testbed import clock
from testbed.decision import Decision, Reserve, Routing
from testbed.pdd.run.config import ClusterConfig
from testbed.types import Mode, Pipeline
from testbed.pdd.roles.peers import Peer, RoleServer
from testbed.pdd.wire.protocol import (Bind, Cancel, Done, Error, ErrorCode, FinishReason, Frame,
                                       Handoff, Health, HealthAck, Report, Request, Role, Started,
                                       Tokens)
from testbed.pdd.policy import (POLICY_BUDGET_S, Candidates, DecoderCandidate, PCandidate,
                                RouteDecision, RouteInputs, default_placement, load_policy)
from testbed.pdd.roles.routing import InflightPrefixes, PrefixMirror, RldBudget
from testbed.pdd.roles.local_model import LocalPathModel
from testbed.pdd.roles.wan_loss import LossMeter
from testbed.pdd.roles.wan_model import WanModel
from testbed.pdd.wire.transport import ConnectionClosed, Transport
from testbed.pdd.wire.status import TcpStatus, WanStatus

log = logging.getLogger(__name__)


class PolicyFailure(Exception):
    """The routing policy raised, or answered something the router cannot use: that
    request fails with this message; the router serves on."""

RECOVERY_BATCH = 1000  # batch number of the router's HANDOFF after RLD loss
# A request that would wait in P's queue longer than this is bound late (at its
# prefill's start, ``RouterNode._queue_unbound``); one that would not, at once.
LATE_BIND_S = 0.001
_ROLES = (Role.PREFILL, Role.RELAY_DECODE, Role.MAIN_DECODE)


@dataclass(eq=False)
class Routed:
    """One request at the router."""

    rid: int
    client: Peer
    client_rid: int
    pipeline: Pipeline | None  # None while late-bound and not yet bound
    names: dict[Role, str]  # the instances of the pipeline's roles
    request: Request | None = None  # the client's request (re-served from it)
    delivered: list[int] = field(default_factory=list)  # ids forwarded, by client position
    offset: int = 0  # client position of the current round's position 0 (re-served: > 0)
    reserves: int = 0  # rounds re-served after a decoder was lost
    rld_tokens: list[int] = field(default_factory=list)
    md_emitted: bool = False
    rld_freed: bool = False
    terminal: bool = False
    md_lost_sent: bool = False
    md_prompt: tuple[int, ...] | None = None  # into MD's mirror once MD has the KV
    recovered: bool = False
    reports: set[Role] = field(default_factory=set)
    rld_tokens_held: int = 0  # modeled KV tokens counted against RLD's budget
    first_pipeline: str = ""  # the pipeline of the first round (re-served requests)
    # the connection of each role instance this round was routed to: a frame about this
    # request from another connection (the instance restarted since) is not this round's
    conns: dict[Role, Peer] = field(default_factory=dict)
    told_off: set[int] = field(default_factory=set)  # id() of connections sent CANCEL for it
    t_arrival: float | None = None  # late-bound: when it arrived (bound at P's STARTED)

    def bind(self, out: dict[str, Peer]) -> None:
        """Bind this round to the router's current connections of its instances."""
        self.conns = {role: out[name] for role, name in self.names.items()
                      if name is not None and name in out and not out[name].conn.closed}

    def from_this_round(self, peer: Peer) -> bool:
        """``peer`` speaks for this round: the connection the round was routed over, or
        the first one of its role when none was open at routing."""
        bound = self.conns.setdefault(peer.role, peer)
        return bound is peer


def placement_record(c: Candidates, now: float) -> dict:
    """The decision record's ``placement``: what each candidate would have cost (P's
    prefill end as seconds from ``now``), for hindsight (testbed/report/hindsight.py)."""
    out = {}
    if len(c.p) > 1:
        out["PREFILL"] = {p.name: {"prefill_end_s": round(p.prefill_end_s - now, 6),
                                   "hit_tokens": p.hit_tokens} for p in c.p}
    for role, pool in (("RELAY_DECODE", c.rld), ("MAIN_DECODE", c.md)):
        if len(pool) > 1:
            out[role] = {x.name: {"active": x.active, "held_tokens": x.held_tokens,
                                  "transfer_s": round(x.transfer_s, 6),
                                  "decode_s": round(x.decode_s, 6),
                                  "delays_s": round(x.delays_s, 6)} for x in pool}
    return out


class RouterNode(RoleServer):
    """The router: see the module docstring."""

    ROLE = Role.ROUTER

    def __init__(self, cfg: ClusterConfig, name: str, transport: Transport):
        super().__init__(cfg, name, transport)
        self.p_mirrors: dict[str, PrefixMirror] = {}  # per P instance: its prefix cache
        self.md_mirrors: dict[str, PrefixMirror] = {}  # per MD instance: its DRC
        self.md_rx: dict[str, tuple[float, float, float, bool]] = {}  # MD's last WAN status
        rc = cfg.router
        self.wan = WanModel(rc.wan_prior_gbit, rc.wan_rtt_s, window_min_s=rc.wan_window_min_s,
                            window_rtts=rc.wan_window_rtts, rtt_window_s=rc.rtt_window_s,
                            margin_band_s=2 * rc.relay_threshold_s,
                            margin_quantile=rc.relay_margin_quantile,
                            margin_window_s=rc.relay_margin_window_s,
                            recovery_half_life_s=rc.wan_recovery_half_life_s,
                            quantum_bytes=cfg.prefill.kv_chunk_tokens * cfg.timing.token_scale
                            * cfg.timing.kv_bytes_per_token)
        self.policy_name = rc.policy or cfg.mode.value
        self.policy = load_policy(self.policy_name, rc.policy_params, field="router.policy")
        self.policy_errors = self.policy_slow = 0
        self.loss = LossMeter(rc.lossy_wan_window_s, rc.lossy_wan_min_segments)
        self.wan_rto_s = 0.0  # P's largest retransmission timeout in its last TCP status
        self.local = LocalPathModel(rc.local_gbit)
        self.rld_budget = RldBudget.of(cfg.timing.cost(Role.RELAY_DECODE), rc,
                                       cfg.model.max_context)
        self.rld_held: dict[str, int] = {}  # modeled KV tokens per RLD
        self.p_free_at: dict[str, float] = {}  # P's expected end of its queued prefills
        self._pings: dict[int, float] = {}  # HEALTH nonce -> send time
        self.md_inflight = InflightPrefixes(cfg.prefill.block_size)
        self._nonces = itertools.count(1)
        self.requests: dict[int, Routed] = {}
        self._by_client: dict[tuple[int, int], Routed] = {}
        # request ids start at the start time (ms) x 65536: a restarted router never hands
        # out an id a role may still hold, or see in a late frame, from the one before it
        self._rid_base = (clock.wall_ns() // 1_000_000) << 16
        self._rids = itertools.count(self._rid_base)
        self._rid_high = self._rid_base - 1  # the highest request id handed out so far
        self.rld_active: dict[str, int] = {}
        self.dead: set[str] = set()

    async def on_start(self) -> None:
        for role in _ROLES:
            for inst in self.cfg.of_role(role):
                await self.peer(inst.name)  # ConnectionClosed if it does not come up
                self.rld_active.setdefault(inst.name, 0)
        for inst in self.cfg.of_role(Role.MAIN_DECODE):
            self.spawn(self._probe_rtt(inst.name), f"rtt {inst.name}")

    async def _probe_rtt(self, md: str) -> None:
        """HEALTH to ``md`` every ``rtt_probe_interval_s``; the ACK is an RTT sample."""
        while True:
            peer = await self.peer_if_live(md)
            if peer is not None:
                nonce = next(self._nonces)
                self._pings[nonce] = clock.now()
                await peer.send(0, Health(nonce))
            if len(self._pings) > 1000:  # unanswered probes (MD gone): forget the oldest
                for n in sorted(self._pings)[:500]:
                    del self._pings[n]
            await asyncio.sleep(self.cfg.router.rtt_probe_interval_s)

    def _new_rid(self) -> int:
        self._rid_high = next(self._rids)
        return self._rid_high

    def _live(self, role: Role) -> list[str]:
        return [i.name for i in self.cfg.of_role(role) if i.name not in self.dead]

    def _choose(self, prompt: Sequence[int], use_policy: bool = True,
                c: Candidates | None = None, max_out: int = 0) -> dict[Role, str | None]:
        """The instances of a new request: the policy's ``place`` if it has one and
        answers, else the router's placement (``policy.default_placement``, every
        built-in's, so modes compare on one placement: each instance by what it costs
        the request, a held prefix worth the prefill or transfer it saves, a load what its
        queue or batch adds; ``_candidates``). A re-served request
        (``use_policy`` False) takes the router's placement. Raises PolicyFailure when
        the policy raises or names an instance that is not a live candidate. ``c``: the
        candidates, when the caller has them already."""
        c = self._candidates(prompt, max_out) if c is None else c
        placement = None
        place = getattr(self.policy, "place", None) if use_policy else None
        if place is not None:
            try:
                placement = place(c)
            except Exception as err:  # a user's policy: whatever it raises fails this request
                raise PolicyFailure(f"policy error in place: {type(err).__name__}: {err}") \
                    from None
        if placement is None:
            placement = default_placement(c)
        out = {Role.PREFILL: getattr(placement, "p", None),
               Role.RELAY_DECODE: getattr(placement, "rld", None),
               Role.MAIN_DECODE: getattr(placement, "md", None)}
        for role, pool in ((Role.PREFILL, c.p), (Role.RELAY_DECODE, c.rld),
                           (Role.MAIN_DECODE, c.md)):
            if out[role] is not None and out[role] not in [x.name for x in pool]:
                raise PolicyFailure(f"policy error in place: {out[role]!r} is not a live "
                                    f"{role.name} instance")
        return out

    def _candidates(self, prompt: Sequence[int], max_out: int = 0) -> Candidates:
        """The live instances with what each costs a request of ``prompt`` and
        ``max_out`` (``policy.base``: P's prefill end; MD's transfer of what it lacks at
        the WAN model's capacity and the request's decode in its batch, and its
        ``delays_s``: that transfer once more for each transfer the WAN model holds on
        the line, each of which it delays as much; RLD's decode)."""
        now, timing = clock.now(), self.cfg.timing
        p_live, rld_live, md_live = (self._live(r) for r in _ROLES)
        cost, n = timing.cost(Role.PREFILL), len(prompt)
        ps = []
        for name in p_live:
            hit = self._p_mirror(name).hit(prompt)
            end = max(now, self.p_free_at.get(name, now)) \
                + cost.prefill_s(n - hit, hit) * timing.time_scale
            ps.append(PCandidate(name, end, hit))
        token_bytes = timing.token_scale * timing.kv_bytes_per_token
        rate = max(self.wan.capacity_gbit(now), 1e-3) * 1e9 / 8  # bytes/s
        md_step, loads = timing.cost(Role.MAIN_DECODE).decode_step_s, self._md_loads()
        sharing = self.wan.n_transfers  # KV transfers on the line now: each waits for ours
        mds = []
        for m in md_live:
            held = max(self._md_mirror(m).hit(prompt), self.md_inflight.longest(m, prompt)[0])
            active, context = loads.get(m, (0, 0))
            transfer = (n - held) * token_bytes / rate
            mds.append(DecoderCandidate(
                m, active, held, transfer,
                max_out * md_step(active + 1, context + n) * timing.time_scale,
                transfer * sharing))
        rld_step, rlds = timing.cost(Role.RELAY_DECODE).decode_step_s, []
        for x in rld_live:
            active = self.rld_active.get(x, 0)
            context = self.rld_held.get(x, 0) // timing.token_scale + n
            rlds.append(DecoderCandidate(
                x, active, 0, 0.0, max_out * rld_step(active + 1, context) * timing.time_scale))
        return Candidates(n, ps, rlds, mds, max_out)

    def _md_loads(self) -> dict[str, tuple[int, int]]:
        """Per MD instance: (live requests, their prompts' tokens)."""
        load: dict[str, tuple[int, int]] = {}
        for r in self.requests.values():
            md_of = r.names.get(Role.MAIN_DECODE)
            if md_of is not None and not r.terminal:
                active, context = load.get(md_of, (0, 0))
                n = len(r.request.prompt_token_ids) if r.request is not None else 0
                load[md_of] = (active + 1, context + n)
        return load

    def _p_mirror(self, p: str) -> PrefixMirror:
        if p not in self.p_mirrors:
            self.p_mirrors[p] = PrefixMirror(self.cfg.prefill.block_size,
                                             self.cfg.prefill.cache_capacity_tokens)
        return self.p_mirrors[p]

    async def on_frame(self, peer: Peer, frame: Frame) -> None:
        rid, msg = frame.request_id, frame.message
        if peer.role == Role.CLIENT:
            if isinstance(msg, Request):
                await self._route(peer, rid, msg)
            elif isinstance(msg, Cancel) and (peer_id := (id(peer), rid)) in self._by_client:
                await self._end(self._by_client[peer_id], None)
            elif not isinstance(msg, Cancel):
                self.stray(peer, frame, "a client sends REQUEST and CANCEL only")
        elif peer.role in _ROLES and peer.outbound and rid in self.requests:
            r = self.requests[rid]
            if r.from_this_round(peer):
                await self._from_role(peer, r, msg)
            elif id(peer) not in r.told_off:  # a restarted instance's work on a request
                r.told_off.add(id(peer))       # the router moved elsewhere: stop it there
                self.stray(peer, frame, f"{peer.name} restarted after this request was "
                                        "routed to it: cancelled there")
                await peer.send(rid, Cancel())
        elif isinstance(msg, HealthAck) and msg.nonce in self._pings:
            now = clock.now()
            self.wan.add_rtt_sample(now, now - self._pings.pop(msg.nonce))
        elif isinstance(msg, Report) and rid == 0 and peer.role == Role.MAIN_DECODE:
            self._on_wan_status(peer.name, msg.data)
        elif isinstance(msg, Report) and rid == 0 and peer.role == Role.PREFILL:
            self._on_tcp_status(msg.data)
        elif isinstance(msg, HealthAck) or self._rid_base <= rid <= self._rid_high:
            pass  # a late answer to a forgotten probe, or a late frame of an ended request
        else:
            self.stray(peer, frame)

    def _on_wan_status(self, md: str, data: dict) -> None:
        """An MD's WAN status: a capacity sample, and what each transfer still misses.

        The line is one for every MD: the sample is the rate of every MD whose last status
        is recent (within two of its intervals) summed, busy if this MD was busy; with
        one MD, its own rate."""
        try:
            st = WanStatus.read(data)
        except ValueError as err:
            log.warning("%s: bad WAN status from %s %r: %s", self.name, md, data, err)
            return
        k, now, interval = self.cfg.timing.kv_scale_k, clock.now(), st.interval_s
        self.md_rx[md] = (now, st.rx_bytes * k / interval if interval > 0 else 0.0,
                          interval, st.busy)
        total = sum(rate for t, rate, iv, _ in self.md_rx.values() if now - t <= 2 * iv)
        self.wan.add_rate_sample(now, total * interval, interval, st.busy)
        for rid, remaining in st.pending.items():
            self.wan.progress(rid, remaining * k, now)
        for rid, t_done in st.kv_done.items():
            self._transfer_over(rid)
            self.wan.kv_done(rid, t_done)

    def _on_tcp_status(self, data: dict) -> None:
        """P's TCP status: segments its connections to MD sent and retransmitted."""
        try:
            st = TcpStatus.read(data)
        except ValueError as err:
            log.warning("%s: bad TCP status %r: %s", self.name, data, err)
            return
        self.loss.add(clock.now(), st.segs_out, st.retrans)
        self.wan_rto_s = st.rto_s

    def held(self) -> dict:
        return self.requests

    async def reject_request(self, peer: Peer, rid: int, why: str,
                             code: ErrorCode = ErrorCode.PROTOCOL) -> None:
        """A REQUEST refused before ``on_frame`` (``RoleServer._refusal``): the decision
        record says why, then ERROR."""
        if peer.role == Role.CLIENT:
            refused = Decision(None, why, self.cfg.mode.value)
            await peer.send(rid, Report(Role.ROUTER, self.name, refused.data()))
        await super().reject_request(peer, rid, why, code)

    async def _route(self, client: Peer, client_rid: int, req: Request) -> None:
        try:
            cands = self._candidates(req.prompt_token_ids, req.max_output_tokens)
            names = self._choose(req.prompt_token_ids, c=cands)
            p = names[Role.PREFILL]
            now = clock.now()
            if p is not None and self.p_free_at.get(p, now) > now + LATE_BIND_S:
                await self._queue_unbound(client, client_rid, req, p, now)
                return
            r, info = self._decide(client, client_rid, req, names, cands)
        except PolicyFailure as err:
            self.policy_errors += 1
            if self.policy_errors <= 20:
                log.warning("%s: %s", self.name, err)
            await self.reject_request(client, client_rid, str(err), ErrorCode.INTERNAL)
            return
        r.request = req
        r.bind(self._out)
        self.requests[r.rid] = r
        self._by_client[(id(client), client_rid)] = r
        await client.send(client_rid, Report(Role.ROUTER, self.name, info.data()))
        missing = [role.name for role, n in r.names.items() if n is None]
        if missing:
            await self._end(r, f"no live instance of {', '.join(missing)}")
            return
        self._count_rld(r)
        meta = dict(req.metadata, pipeline=r.pipeline.value, rld=names[Role.RELAY_DECODE],
                    md=names[Role.MAIN_DECODE])
        p = await self.peer_if_live(r.names[Role.PREFILL])
        if p is None or not await p.send(r.rid, Request(req.prompt_token_ids,
                                                        req.max_output_tokens, meta)):
            await self._end(r, "prefill unavailable")

    async def _queue_unbound(self, client: Peer, client_rid: int, req: Request, p: str,
                             now: float) -> None:
        """Late binding: ``req`` would wait in P's queue, so only its P is chosen now (P's
        mirror and queue take it); the pipeline and decoders are chosen when its prefill
        starts (P's STARTED, ``_bind_late``), on the WAN and loads of that moment: a WAN
        dip that begins while the request queues is seen by its decision."""
        prompt, timing = req.prompt_token_ids, self.cfg.timing
        hit = self._p_mirror(p).route(prompt)
        prefill_s = timing.cost(Role.PREFILL).prefill_s(len(prompt) - hit, hit)
        self.p_free_at[p] = max(now, self.p_free_at.get(p, now)) + prefill_s * timing.time_scale
        r = Routed(self._new_rid(), client, client_rid, None, {Role.PREFILL: p}, request=req,
                   t_arrival=now)
        r.bind(self._out)
        self.requests[r.rid] = r
        self._by_client[(id(client), client_rid)] = r
        peer = await self.peer_if_live(p)
        if peer is None or not await peer.send(r.rid, Request(
                prompt, req.max_output_tokens, dict(req.metadata, bind="late"))):
            await self._end(r, "prefill unavailable")

    async def _bind_late(self, r: Routed, hit: int) -> None:
        """P started the prefill of unbound ``r`` with ``hit`` tokens cached: choose its
        pipeline and decoders now, report the decision, and BIND them at P."""
        req, p = r.request, r.names[Role.PREFILL]
        try:
            cands = self._candidates(req.prompt_token_ids, req.max_output_tokens)
            names = self._choose(req.prompt_token_ids, c=cands)
            names[Role.PREFILL] = p  # P is the one prefilling it
            bound, info = self._decide(r.client, r.client_rid, req, names, cands,
                                       started=(hit, r.rid, r.t_arrival))
        except PolicyFailure as err:
            self.policy_errors += 1
            if self.policy_errors <= 20:
                log.warning("%s: %s", self.name, err)
            await self._end(r, str(err))
            return
        r.pipeline, r.names = bound.pipeline, bound.names
        r.rld_tokens_held, r.md_prompt = bound.rld_tokens_held, bound.md_prompt
        r.bind(self._out)
        await r.client.send(r.client_rid, Report(Role.ROUTER, self.name, info.data()))
        missing = [role.name for role, n in r.names.items() if n is None]
        if missing:
            await self._end(r, f"no live instance of {', '.join(missing)}")
            return
        self._count_rld(r)
        peer = await self.peer_if_live(p)
        if peer is None or not await peer.send(r.rid, Bind({
                "pipeline": r.pipeline.value, "rld": names[Role.RELAY_DECODE],
                "md": names[Role.MAIN_DECODE]})):
            await self._end(r, "prefill unavailable")

    def _count_rld(self, r: Routed) -> None:
        """RLD's load takes routed ``r`` (its live requests and modeled KV tokens)."""
        if r.names.get(Role.RELAY_DECODE):
            rld = r.names[Role.RELAY_DECODE]
            self.rld_active[rld] = self.rld_active.get(rld, 0) + 1
            self.rld_held[rld] = self.rld_held.get(rld, 0) + r.rld_tokens_held

    def _decide(self, client: Peer, client_rid: int, req: Request, names: dict,
                cands: Candidates, started: tuple[int, int, float] | None = None
                ) -> tuple[Routed, Decision]:
        """The pipeline of ``req`` and its decision record (every input, the prediction).
        ``started``: (P's hit tokens, request id, arrival time) of a late-bound request
        whose prefill starts now (P and its queue were counted at arrival)."""
        now, cfg, timing = clock.now(), self.cfg, self.cfg.timing
        prompt, n = req.prompt_token_ids, len(req.prompt_token_ids)
        p_name = names[Role.PREFILL]
        if started is not None:
            hit = started[0]
        else:
            hit = self._p_mirror(p_name).route(prompt) if p_name is not None else 0
        md_mirror = self._md_mirror(names[Role.MAIN_DECODE])
        md_hit = hit if md_mirror is None else md_mirror.hit(prompt)
        prefill_s = timing.cost(Role.PREFILL).prefill_s(n - hit, hit) * timing.time_scale
        p_start = now if started is not None else max(now, self.p_free_at.get(p_name, now))
        p_end = p_start + prefill_s
        md = names[Role.MAIN_DECODE]
        shared, dep_arrival = self.md_inflight.longest(md, prompt)
        start = p_end
        if shared > md_hit:  # MD will wait for that transfer, then fetch the rest
            md_hit, start = shared, max(p_end, dep_arrival)
        wan_bytes = (n - md_hit) * timing.token_scale * timing.kv_bytes_per_token
        pred = self.wan.predict(now, wan_bytes, start)
        # the late-KV rule (rld-only: nothing crosses, so nothing measures) on the estimate
        # returning toward the line rate (wan_model: a held ~0 locked in otherwise)
        late = self.wan.predict(now, wan_bytes, start, optimistic=True)
        if start > p_end:  # measured from P's prefill end, the wait for the prefix included
            pred = dataclasses.replace(pred, wan_s=pred.wan_s + start - p_end, start_s=p_end)
            late = dataclasses.replace(late, wan_s=late.wan_s + start - p_end, start_s=p_end)
        rld = names[Role.RELAY_DECODE]
        active = self.rld_active.get(rld, 0)
        held = n * timing.token_scale + req.max_output_tokens
        room = ("no live RELAY_DECODE" if rld is None
                else self.rld_budget.room(active, self.rld_held.get(rld, 0), held))
        kv_token_bytes = timing.token_scale * timing.kv_bytes_per_token
        local_start = p_start if cfg.prefill.layerwise_local else p_end
        local_s = self.local.predict(now, n * kv_token_bytes, local_start, p_end,
                                     min(n, cfg.prefill.kv_chunk_tokens) * kv_token_bytes)
        step = timing.cost(Role.RELAY_DECODE).decode_step_s(active + 1, (active + 1) * n)
        rld_decode_s = req.max_output_tokens * step * timing.time_scale
        margin = self.wan.margin_s(now, pred.wan_s)  # scaled to this request's size
        retrans_share = self.loss.share(now)
        inputs = RouteInputs(n, req.max_output_tokens, pred.wan_s, rld_decode_s, room,
                             warmup=bool(req.metadata.get("warmup")), wan_margin_s=margin,
                             md_live=md is not None, local_s=local_s, late_wan_s=late.wan_s,
                             wan_retrans_share=retrans_share, p_hit_tokens=hit,
                             md_hit_tokens=md_hit, rld_active=active,
                             md_active=next((m.active for m in cands.md if m.name == md), 0))
        d, policy_s = self._policy_decide(inputs)
        involved = {Role.PREFILL}
        if d.pipeline != Pipeline.P_MD:
            involved.add(Role.RELAY_DECODE)
        if d.pipeline != Pipeline.RLD_ONLY:
            involved.add(Role.MAIN_DECODE)
        r = Routed(self._new_rid() if started is None else started[1], client, client_rid,
                   d.pipeline, {role: names[role] for role in involved})
        if p_name is not None:  # a late one: P may run behind what its queue said
            self.p_free_at[p_name] = p_end if started is None \
                else max(p_end, self.p_free_at.get(p_name, p_end))
        if Role.RELAY_DECODE in involved:
            r.rld_tokens_held = held
            self.local.commit(r.rid, n * kv_token_bytes, local_start)
        if Role.MAIN_DECODE in involved:
            self.wan.commit(r.rid, wan_bytes, start)
            self.md_inflight.add(md, r.rid, prompt, pred.arrival_s)
            self.wan.watch(r.rid, now, wan_bytes, pred)
            if md_mirror is not None:
                r.md_prompt = tuple(prompt)  # MD's DRC will insert it
        routing = Routing(
            t_route=round(now, 6), policy=self.policy_name, policy_us=round(policy_s * 1e6, 1),
            predicted_prefill_s=round(prefill_s, 6), predicted_prefill_end_s=round(p_end, 6),
            predicted_wan_s=round(pred.wan_s, 6), predicted_kv_at_md_s=round(pred.arrival_s, 6),
            predicted_local_s=round(local_s, 6), late_kv_wan_s=round(late.wan_s, 6),
            wan_gbit=round(pred.capacity_gbit, 4),
            wan_gbit_recovered=round(late.capacity_gbit, 4), wan_rtt_s=round(pred.rtt_s, 6),
            wan_overhead_s=round(pred.overhead_s, 6),
            wan_queue_delay_s=round(pred.queue_delay_s, 6),
            wan_capacity_age_s=round(pred.capacity_age_s, 3),
            wan_backlog_bytes=int(pred.backlog_bytes),
            wan_backlog_transfers=pred.backlog_transfers, wan_margin_s=round(margin, 6),
            wan_margin_samples=self.wan.n_errors, wan_nominal_bytes=wan_bytes,
            wan_retrans_share=round(retrans_share, 6),
            wan_retrans_segments=self.loss.counts(now)[0], wan_rto_s=round(self.wan_rto_s, 6),
            local_backlog_bytes=int(self.local.backlog_bytes(now)),
            local_backlog_transfers=self.local.n_transfers, inflight_shared_tokens=shared,
            router_hit_tokens=hit, router_md_hit_tokens=md_hit, rld_active=active,
            rld_held_tokens=self.rld_held.get(rld, 0),
            rld_budget_max_batch=self.rld_budget.max_batch,
            rld_budget_kv_tokens=self.rld_budget.kv_tokens, rld_decode_s=round(rld_decode_s, 6))
        ordered = sorted(involved, key=lambda x: x.name)
        info = Decision(d.pipeline.value, d.reason, cfg.mode.value,
                        tuple(role.name for role in ordered),
                        {role.name: names[role] for role in ordered}, routing,
                        placement=placement_record(cands, now),
                        t_arrival=None if started is None else round(started[2], 6))
        return r, info

    def _policy_decide(self, inputs: RouteInputs) -> tuple[RouteDecision, float]:
        """The policy's decision and the time it took; PolicyFailure if it raises or
        answers something that is not a RouteDecision with a Pipeline."""
        t0 = clock.perf()
        try:
            d = self.policy.decide(inputs, self.cfg.router, self.cfg.timing)
        except Exception as err:  # a user's policy: whatever it raises fails this request
            raise PolicyFailure(f"policy error: {type(err).__name__}: {err}") from None
        took = clock.perf() - t0
        if not isinstance(getattr(d, "pipeline", None), Pipeline):
            raise PolicyFailure(f"policy error: decide returned {d!r}, not a RouteDecision")
        if took > POLICY_BUDGET_S:
            self.policy_slow += 1
            if self.policy_slow <= 20 or self.policy_slow % 100 == 0:
                log.warning("%s: policy %s took %.1f ms for one decision (budget %.1f ms; "
                            "%d so far)", self.name, self.policy_name, took * 1e3,
                            POLICY_BUDGET_S * 1e3, self.policy_slow)
        return RouteDecision(d.pipeline, str(d.reason)), took

    def _transfer_over(self, rid: int) -> None:
        """Request ``rid``'s KV is at MD, or will not be: out of the backlog."""
        self.wan.done(rid)
        self.md_inflight.remove(rid)

    def _md_has_kv(self, r: Routed) -> None:
        """MD holds the prompt's KV (its first token, or its transfer report):
        its DRC inserted the prompt, so the mirror does too. Not earlier: a
        next turn routed while the transfer is under way finds MD without it
        (MD fetches it again)."""
        self._transfer_over(r.rid)
        if r.md_prompt is not None:
            mirror = self._md_mirror(r.names.get(Role.MAIN_DECODE))
            if mirror is not None:
                mirror.record(r.md_prompt)
            r.md_prompt = None

    def _md_mirror(self, md: str | None) -> PrefixMirror | None:
        if md is None:
            return None
        if md not in self.md_mirrors:
            self.md_mirrors[md] = PrefixMirror(self.cfg.prefill.block_size,
                                               self.cfg.main.drc_capacity_tokens)
        return self.md_mirrors[md]

    async def peer_if_live(self, name: str | None) -> Peer | None:
        if name is None or name in self.dead or name not in self._out:
            return None
        return self._out[name]

    async def _from_role(self, peer: Peer, r: Routed, msg) -> None:
        if isinstance(msg, Started):
            if r.pipeline is None and not r.terminal and peer.role == Role.PREFILL:
                await self._bind_late(r, msg.hit_tokens)
            return
        if isinstance(msg, Report):
            await self._on_report(r, msg)
            return
        if r.terminal:
            return
        if isinstance(msg, Tokens):
            if msg.producer == Role.RELAY_DECODE:
                self.local.done(r.rid)  # RLD emits once P's KV_DONE reached it
                r.rld_tokens[msg.start_position:] = msg.token_ids
            else:
                r.md_emitted = True
                self._md_has_kv(r)
            if r.offset:
                msg = msg.at(msg.start_position + r.offset)
            r.delivered[msg.start_position:] = msg.token_ids
            await r.client.send(r.client_rid, msg)
        elif isinstance(msg, Done):
            await self._end(r, None, Done(msg.num_output_tokens + r.offset, msg.finish_reason))
        elif isinstance(msg, Error) and peer.role == Role.RELAY_DECODE:
            # RLD's answer to "md lost": it had already sent its final batch and freed it
            await self._reserve(r, Role.MAIN_DECODE, f"MAIN_DECODE lost after the final "
                                                     f"handoff ({msg.reason})")
        elif isinstance(msg, Error):
            await self._path_failed(r, _failed_path(peer.role, msg), msg.reason)

    async def _on_report(self, r: Routed, msg: Report) -> None:
        if msg.role in r.reports:
            return
        r.reports.add(msg.role)
        if msg.role == Role.RELAY_DECODE:
            r.rld_freed = True
            self.local.done(r.rid)
            name = r.names[Role.RELAY_DECODE]
            self.rld_active[name] = max(0, self.rld_active.get(name, 0) - 1)
            self.rld_held[name] = max(0, self.rld_held.get(name, 0) - r.rld_tokens_held)
        if msg.role == Role.PREFILL and "t_prefill_end" in msg.data:
            self.wan.prefill_ended(r.rid, float(msg.data["t_prefill_end"]))
        if msg.role == Role.MAIN_DECODE:
            self._transfer_over(r.rid)  # the transfer ended (KV at MD, or cancelled)
            if "kv_transfer_s" in msg.data:
                self._md_has_kv(r)
        if r.terminal and r.reports >= set(r.names):
            self._forget(r)  # before the client has its last REPORT (see _end)
        await r.client.send(r.client_rid, msg)

    async def _path_failed(self, r: Routed, role: Role, why: str) -> None:
        if r.terminal:
            return
        names = r.names
        if role == Role.MAIN_DECODE and r.pipeline == Pipeline.P_RLD_MD and not r.md_emitted \
                and not r.rld_freed and names[Role.RELAY_DECODE] not in self.dead:
            rld = await self.peer_if_live(names[Role.RELAY_DECODE])
            if not r.md_lost_sent and rld is not None:
                r.md_lost_sent = True
                await rld.send(r.rid, Error(ErrorCode.UNAVAILABLE, f"md lost: {why}"))
            return
        if role == Role.RELAY_DECODE and r.pipeline == Pipeline.P_RLD_MD:
            md = await self.peer_if_live(names[Role.MAIN_DECODE])
            if md is not None and (r.rld_freed or r.recovered):
                return  # RLD had handed over, or MD already has RLD's tokens: MD carries on
            if md is not None:
                r.recovered = True
                await md.send(r.rid, Handoff(RECOVERY_BATCH, 0, tuple(r.rld_tokens), True))
                return
        if role == Role.PREFILL:
            if r.rld_tokens or r.md_emitted:
                return  # the KV had already left P
            await self._end(r, f"{role.name} lost: {why}")
            return
        await self._reserve(r, role, f"{role.name} lost: {why}")

    async def _reserve(self, r: Routed, lost: Role, why: str) -> None:
        """Re-serve ``r`` after decoder ``lost`` died holding it: P prefills the prompt
        plus every token the client has, and the other decoder continues from there
        (RLD ``rld-only`` when MD was lost, within RLD's room; MD ``p-md`` when RLD
        was). The client sees each position once: the new round's positions start
        at ``len(r.delivered)``. Fails the request when no role can continue it."""
        if r.terminal:
            return
        req, d = r.request, len(r.delivered)
        if req is not None and d >= req.max_output_tokens:  # only DONE was lost
            await self._end(r, None, Done(d, FinishReason.LENGTH))
            return
        target, pipeline, cannot = self._reserve_target(r, lost)
        if cannot is not None:
            await self._end(r, f"{why}; not re-served: {cannot}")
            return
        for name in r.names.values():  # stop what is left of the old round
            if (peer := await self.peer_if_live(name)) is not None:
                await peer.send(r.rid, Cancel())
        self._retire(r)
        prompt = tuple(req.prompt_token_ids) + tuple(r.delivered)
        p = self._choose(prompt, use_policy=False, max_out=req.max_output_tokens - d)[Role.PREFILL]
        decoder = Role.RELAY_DECODE if pipeline == Pipeline.RLD_ONLY else Role.MAIN_DECODE
        first = r.pipeline.value if not r.reserves else r.first_pipeline
        r.rid, r.offset, r.reserves, r.first_pipeline = self._new_rid(), d, r.reserves + 1, first
        r.pipeline, r.names, r.reports = pipeline, {Role.PREFILL: p, decoder: target}, set()
        r.rld_tokens, r.md_emitted, r.rld_freed = [], False, False
        r.md_lost_sent = r.recovered = False
        r.md_prompt, r.rld_tokens_held = None, 0
        r.bind(self._out)
        self.requests[r.rid] = r
        if decoder == Role.RELAY_DECODE:
            r.rld_tokens_held = self._rld_tokens(req, d)
            self.rld_active[target] = self.rld_active.get(target, 0) + 1
            self.rld_held[target] = self.rld_held.get(target, 0) + r.rld_tokens_held
        reserve = Reserve(f"{first}->re-served-{pipeline.value}", f"re-served after {why}",
                          r.reserves, d, lost.name, round(clock.now(), 6),
                          tuple(sorted(role.name for role in r.names)), self.cfg.mode.value)
        await r.client.send(r.client_rid, Report(Role.ROUTER, self.name, reserve.data()))
        meta = dict(req.metadata, pipeline=pipeline.value, rld=r.names.get(Role.RELAY_DECODE),
                    md=r.names.get(Role.MAIN_DECODE))
        peer = await self.peer_if_live(p)
        if peer is None or not await peer.send(r.rid, Request(
                prompt, req.max_output_tokens - d, meta)):
            await self._end(r, f"{why}; not re-served: prefill unavailable")

    def _reserve_target(self, r: Routed, lost: Role) -> tuple[str | None, Pipeline, str | None]:
        """(decoder instance, pipeline, None) to re-serve ``r`` on, or (.., why not)."""
        if self.cfg.mode in (Mode.CROSS_DC_PD, Mode.SAME_DC_PD):
            return None, Pipeline.P_MD, f"{self.cfg.mode.value} has one decoder only"
        if r.request is None or not self._live(Role.PREFILL):
            return None, Pipeline.P_MD, "no live PREFILL"
        chosen = self._choose(tuple(r.request.prompt_token_ids) + tuple(r.delivered),
                              use_policy=False,
                              max_out=r.request.max_output_tokens - len(r.delivered))
        if lost == Role.RELAY_DECODE:
            md = chosen[Role.MAIN_DECODE]
            return md, Pipeline.P_MD, None if md else "no live MAIN_DECODE"
        rld = chosen[Role.RELAY_DECODE]
        if rld is None:
            return None, Pipeline.RLD_ONLY, "no live RELAY_DECODE"
        room = self.rld_budget.room(self.rld_active.get(rld, 0), self.rld_held.get(rld, 0),
                                    self._rld_tokens(r.request, len(r.delivered)))
        return rld, Pipeline.RLD_ONLY, room

    def _rld_tokens(self, req: Request, delivered: int) -> int:
        """Modeled KV tokens RLD holds for ``req`` re-served after ``delivered`` tokens."""
        return (len(req.prompt_token_ids) + delivered) * self.cfg.timing.token_scale \
            + req.max_output_tokens - delivered

    def _retire(self, r: Routed) -> None:
        """The old round of a re-served request: out of the id map and the WAN model."""
        self.requests.pop(r.rid, None)
        self.wan.forget(r.rid)
        self.local.done(r.rid)
        self.md_inflight.remove(r.rid)

    async def on_peer_lost(self, peer: Peer) -> None:
        if peer.role == Role.CLIENT:  # nobody left to serve: cancel its open requests
            for r in [r for r in self.requests.values() if r.client is peer]:
                await self._end(r, None)
            return
        if peer.role not in _ROLES or not peer.outbound:
            return  # the router's links to roles are its own; an inbound "role" is a stranger
        if peer.name not in self.dead:
            self.spawn(self._revive(peer.name, peer.role), f"revive {peer.name}")
        self.dead.add(peer.name)
        for r in list(self.requests.values()):
            if not r.terminal and r.names.get(peer.role) == peer.name:
                await self._path_failed(r, peer.role, f"connection to {peer.name} lost")

    async def _revive(self, name: str, role: Role) -> None:
        """Reconnect to a lost instance every ``revive_interval_s`` until it answers (a
        restarted process); then route to it again. A restarted process starts empty:
        MD's DRC and P's prefix cache are forgotten, RLD holds nothing."""
        while not self._stopped:
            await asyncio.sleep(self.cfg.router.revive_interval_s)
            try:
                await self.peer(name)
            except ConnectionClosed:
                continue
            if role == Role.MAIN_DECODE:
                self.md_mirrors.pop(name, None)
                self.md_inflight.forget_md(name)
            elif role == Role.PREFILL:
                self.p_mirrors.pop(name, None)
                self.p_free_at.pop(name, None)
            else:
                self.rld_active[name], self.rld_held[name] = 0, 0
            self.dead.discard(name)
            log.info("%s is back: routing to it again", name)
            return

    async def _end(self, r: Routed, failure: str | None, done: Done | None = None) -> None:
        """The request is over: MD's DONE (``done``, forwarded to the client), the
        client's CANCEL or its loss (neither), or ``failure`` (an ERROR to the client).
        A request whose REPORTs are all in is forgotten before the client hears the end:
        a client that sends its next request as soon as it has this one's DONE and
        REPORTs (the gateway's admission frees the slot then) must not find this one
        still counted against limits.max_requests while the sends below wait."""
        if r.terminal:
            return
        r.terminal = True
        # A relayed request that RLD finished before MD had its KV: let the WAN
        # transfer complete so MD's DRC still gets the prefix (DRC stays aligned
        # with P's cache); RLD cancels MD when MD reports KV_READY.
        keep_wan = failure is None and r.pipeline == Pipeline.P_RLD_MD and not r.md_emitted
        cancel = [name for role, name in r.names.items()
                  if not (keep_wan and role in (Role.PREFILL, Role.MAIN_DECODE))]
        if Role.MAIN_DECODE in r.names and not keep_wan:
            self._transfer_over(r.rid)
        if r.reports >= set(r.names):
            self._forget(r)
        if r.pipeline is None:  # ended unbound, before its prefill started: no pipeline
            why = failure or "cancelled"
            unbound = Decision(None, f"ended before its prefill started: {why}",
                               self.cfg.mode.value, t_arrival=r.t_arrival)
            await r.client.send(r.client_rid, Report(Role.ROUTER, self.name, unbound.data()))
        if failure is not None:
            await r.client.send(r.client_rid, Error(ErrorCode.UNAVAILABLE, failure))
        elif done is not None:
            await r.client.send(r.client_rid, done)
        for name in cancel:
            peer = await self.peer_if_live(name)
            if peer is not None:
                await peer.send(r.rid, Cancel())

    def _forget(self, r: Routed) -> None:
        self.requests.pop(r.rid, None)
        self.wan.forget(r.rid)
        self.local.done(r.rid)
        self.md_inflight.remove(r.rid)
        self._by_client.pop((id(r.client), r.client_rid), None)


def _failed_path(sender: Role, err: Error) -> Role:
    """Which role's path an ERROR is about: P and MD name it first ("ROLE: why")."""
    head = err.reason.split(":", 1)[0]
    return Role[head] if head in ("MAIN_DECODE", "RELAY_DECODE") else sender
