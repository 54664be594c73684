"""The router role (DC A): routes client requests, forwards results, handles role loss.

Lifecycle: ``start()`` listens for clients and connects to every P, RLD and
MD instance of the config (each role learns the router from that HELLO and
sends TOKENS, DONE, ERROR and REPORT back on it). Per request:

1. client REQUEST(prompt, max_out, {id, session}) -> a router request id;
   P's expected hit and the chosen MD's expected DRC hit from the router's
   prefix mirrors; ``routing.choose_pipeline``
   picks the pipeline; the router REPORTs its decision to the client
   (``pipeline``, ``reason``, ``expected_wan_s``, ``roles``) and sends P the
   REQUEST with metadata {pipeline, rld, md}.
2. TOKENS, DONE, ERROR and REPORT from the roles are forwarded to the client
   under the client's request id. The router keeps every token id RLD
   emitted (for RLD loss), counts RLD's live requests (+1 when routed, -1 at
   RLD's REPORT, which RLD sends when it frees the request) and feeds MD's
   transfer reports to the WAN estimate.
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

import itertools
from dataclasses import dataclass, field

from testbed.pdd.config import ClusterConfig, Pipeline
from testbed.pdd.peers import Peer, RoleServer
from testbed.pdd.protocol import (Cancel, Done, Error, ErrorCode, Frame, Handoff, Report, Request,
                                  Role, Tokens)
from testbed.pdd.routing import PrefixMirror, RouteInputs, WanEstimate, choose_pipeline
from testbed.pdd.transport import Transport

RECOVERY_BATCH = 1000  # batch number of the router's HANDOFF after RLD loss
_ROLES = (Role.PREFILL, Role.RELAY_DECODE, Role.MAIN_DECODE)


@dataclass(eq=False)
class Routed:
    """One request at the router."""

    rid: int
    client: Peer
    client_rid: int
    pipeline: Pipeline
    names: dict[Role, str]  # the instances of the pipeline's roles
    rld_tokens: list[int] = field(default_factory=list)
    md_emitted: bool = False
    rld_freed: bool = False
    terminal: bool = False
    md_lost_sent: bool = False
    md_prompt: tuple[int, ...] | None = None  # into MD's mirror once MD has the KV
    recovered: bool = False
    reports: set[Role] = field(default_factory=set)


class RouterNode(RoleServer):
    """The router: see the module docstring."""

    ROLE = Role.ROUTER

    def __init__(self, cfg: ClusterConfig, name: str, transport: Transport):
        super().__init__(cfg, name, transport)
        self.mirror = PrefixMirror(cfg.prefill.block_size, cfg.prefill.cache_capacity_tokens)
        self.md_mirrors: dict[str, PrefixMirror] = {}  # per MD instance: its DRC
        self.wan = WanEstimate(cfg.router, cfg.timing.kv_scale_k)
        self.requests: dict[int, Routed] = {}
        self._by_client: dict[tuple[int, int], Routed] = {}
        self._rids = itertools.count(1)
        self._rr = itertools.count()
        self.rld_active: dict[str, int] = {}
        self.dead: set[str] = set()
        self.decisions: list[dict] = []  # one per routed request, for tests and logs

    async def on_start(self) -> None:
        for role in _ROLES:
            for inst in self.cfg.of_role(role):
                await self.peer(inst.name)  # ConnectionClosed if it does not come up
                self.rld_active.setdefault(inst.name, 0)

    def _pick(self, role: Role) -> str | None:
        live = [i.name for i in self.cfg.of_role(role) if i.name not in self.dead]
        return live[next(self._rr) % len(live)] if live else None

    async def on_frame(self, peer: Peer, frame: Frame) -> None:
        rid, msg = frame.request_id, frame.message
        if peer.role == Role.CLIENT:
            if isinstance(msg, Request):
                await self._route(peer, rid, msg)
            elif isinstance(msg, Cancel) and (peer_id := (id(peer), rid)) in self._by_client:
                await self._end(self._by_client[peer_id], None)
        elif peer.role in _ROLES and rid in self.requests:
            await self._from_role(peer, self.requests[rid], msg)

    def _invalid(self, req: Request) -> str | None:
        """Why the tiny model cannot serve ``req`` (checked before routing), or None."""
        m = self.cfg.model
        if len(req.prompt_token_ids) + req.max_output_tokens > m.max_context:
            return f"prompt + max output exceed the model's context of {m.max_context} tokens"
        if max(req.prompt_token_ids) >= m.vocab_size:
            return f"prompt has token ids >= the vocabulary size {m.vocab_size}"
        return None

    async def _route(self, client: Peer, client_rid: int, req: Request) -> None:
        if (why := self._invalid(req)) is not None:
            info = {"pipeline": None, "reason": why, "roles": [], "mode": self.cfg.mode.value}
            await client.send(client_rid, Report(Role.ROUTER, self.name, info))
            await client.send(client_rid, Error(ErrorCode.PROTOCOL, f"rejected: {why}"))
            return
        names = {role: self._pick(role) for role in _ROLES}
        hit = self.mirror.route(req.prompt_token_ids)
        md_mirror = self._md_mirror(names[Role.MAIN_DECODE])
        md_hit = None if md_mirror is None else md_mirror.hit(req.prompt_token_ids)
        active = self.rld_active.get(names[Role.RELAY_DECODE], 0)
        inputs = RouteInputs(len(req.prompt_token_ids), req.max_output_tokens, hit, active,
                             md_hit)
        d = choose_pipeline(self.cfg.mode, self.cfg.router, self.cfg.timing, inputs, self.wan.gbit)
        involved = {Role.PREFILL}
        if d.pipeline != Pipeline.P_MD:
            involved.add(Role.RELAY_DECODE)
        if d.pipeline != Pipeline.RLD_ONLY:
            involved.add(Role.MAIN_DECODE)
        r = Routed(next(self._rids), client, client_rid, d.pipeline,
                   {role: names[role] for role in involved})
        if md_mirror is not None and d.pipeline != Pipeline.RLD_ONLY:
            r.md_prompt = tuple(req.prompt_token_ids)  # MD's DRC will insert it
        self.requests[r.rid] = r
        self._by_client[(id(client), client_rid)] = r
        info = {"pipeline": d.pipeline.value, "reason": d.reason,
                "expected_wan_s": d.expected_wan_s,
                "router_hit_tokens": hit, "router_md_hit_tokens": md_hit,
                "wan_gbit": self.wan.gbit, "rld_active": active,
                "roles": sorted(role.name for role in involved), "mode": self.cfg.mode.value}
        self.decisions.append(dict(info, rid=r.rid))
        await client.send(client_rid, Report(Role.ROUTER, self.name, info))
        missing = [role.name for role, n in r.names.items() if n is None]
        if missing:
            await self._end(r, f"no live instance of {', '.join(missing)}")
            return
        if r.names.get(Role.RELAY_DECODE):
            rld = r.names[Role.RELAY_DECODE]
            self.rld_active[rld] = self.rld_active.get(rld, 0) + 1
        meta = dict(req.metadata, pipeline=d.pipeline.value, rld=names[Role.RELAY_DECODE],
                    md=names[Role.MAIN_DECODE])
        p = await self.peer_if_live(r.names[Role.PREFILL])
        if p is None or not await p.send(r.rid, Request(req.prompt_token_ids,
                                                        req.max_output_tokens, meta)):
            await self._end(r, "prefill unavailable")

    def _md_has_kv(self, r: Routed) -> None:
        """MD holds the prompt's KV (its first token, or its transfer report):
        its DRC inserted the prompt, so the mirror does too. Not earlier: a
        next turn routed while the transfer is under way finds MD without it
        (MD fetches it again)."""
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
        if isinstance(msg, Report):
            await self._on_report(r, msg)
            return
        if r.terminal:
            return
        if isinstance(msg, Tokens):
            if msg.producer == Role.RELAY_DECODE:
                r.rld_tokens[msg.start_position:] = msg.token_ids
            else:
                r.md_emitted = True
                self._md_has_kv(r)
            await r.client.send(r.client_rid, msg)
        elif isinstance(msg, Done):
            await r.client.send(r.client_rid, msg)
            await self._end(r, None)
        elif isinstance(msg, Error) and peer.role == Role.RELAY_DECODE:
            # RLD's answer to "md lost": it had already sent its final batch
            await self._end(r, f"MAIN_DECODE lost after the final handoff ({msg.reason})")
        elif isinstance(msg, Error):
            await self._path_failed(r, _failed_path(peer.role, msg), msg.reason)

    async def _on_report(self, r: Routed, msg: Report) -> None:
        if msg.role in r.reports:
            return
        r.reports.add(msg.role)
        if msg.role == Role.RELAY_DECODE:
            r.rld_freed = True
            name = r.names[Role.RELAY_DECODE]
            self.rld_active[name] = max(0, self.rld_active.get(name, 0) - 1)
        if msg.role == Role.MAIN_DECODE and "kv_transfer_s" in msg.data:
            self.wan.add(int(msg.data.get("kv_wan_bytes", 0)), float(msg.data["kv_transfer_s"]))
            self._md_has_kv(r)
        await r.client.send(r.client_rid, msg)
        if r.terminal and r.reports >= set(r.names):
            self._forget(r)

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
            if r.rld_freed and md is not None:
                return  # RLD had handed over: MD carries on
            if md is not None and not r.recovered:
                r.recovered = True
                await md.send(r.rid, Handoff(RECOVERY_BATCH, 0, tuple(r.rld_tokens), True))
                return
        if role == Role.PREFILL and (r.rld_tokens or r.md_emitted):
            return  # the KV had already left P
        await self._end(r, f"{role.name} lost: {why}")

    async def on_peer_lost(self, peer: Peer) -> None:
        if peer.role == Role.CLIENT:  # nobody left to serve: cancel its open requests
            for r in [r for r in self.requests.values() if r.client is peer]:
                await self._end(r, None)
            return
        if peer.role not in _ROLES:
            return
        self.dead.add(peer.name)
        for r in list(self.requests.values()):
            if not r.terminal and r.names.get(peer.role) == peer.name:
                await self._path_failed(r, peer.role, f"connection to {peer.name} lost")

    async def _end(self, r: Routed, failure: str | None) -> None:
        """The request is over (DONE forwarded, client CANCEL, or ``failure``)."""
        if r.terminal:
            return
        r.terminal = True
        if failure is not None:
            await r.client.send(r.client_rid, Error(ErrorCode.UNAVAILABLE, failure))
        # A relayed request that RLD finished before MD had its KV: let the WAN
        # transfer complete so MD's DRC still gets the prefix (DRC stays aligned
        # with P's cache); RLD cancels MD when MD reports KV_READY.
        keep_wan = failure is None and r.pipeline == Pipeline.P_RLD_MD and not r.md_emitted
        for role, name in r.names.items():
            if keep_wan and role in (Role.PREFILL, Role.MAIN_DECODE):
                continue
            peer = await self.peer_if_live(name)
            if peer is not None:
                await peer.send(r.rid, Cancel())
        if r.reports >= set(r.names):
            self._forget(r)

    def _forget(self, r: Routed) -> None:
        self.requests.pop(r.rid, None)
        self._by_client.pop((id(r.client), r.client_rid), None)


def _failed_path(sender: Role, err: Error) -> Role:
    """Which role's path an ERROR is about: P and MD name it first ("ROLE: why")."""
    head = err.reason.split(":", 1)[0]
    return Role[head] if head in ("MAIN_DECODE", "RELAY_DECODE") else sender
