"""What the client records about one request, and its requests.jsonl line.

Owns ``ClientRequest`` (one workload entry) and ``RequestTrace`` (everything
received for it: tokens by position with arrival time and producer,
duplicates, DONE/ERROR, every role's REPORT). ``RequestTrace.record()``
makes the line of requests.jsonl with the fields of docs/pdd-roles.md:

  id, session, mode, pipeline, prompt_len, max_out, p_hit_rate, md_hit_rate,
  status, reason, t_sent, ttft_s, e2e_s, tokens [[position, id, t_rel_s,
  producer]], tokens_lost, tokens_duplicated, handoff {mode, batches,
  stall_ms}, bytes {kv_intra, kv_wan, handoff, tokens}, overruns
  {steps, kv_bytes}, kv_at_md {predicted_s, actual_s, predicted_wan_s,
  actual_wan_s}, relay_overhead_ms, plus ``prompt`` (for ``verify``) and
  ``reports`` (raw REPORT data by role, for debugging).

``relay_overhead_ms``: P's prefill end (its REPORT's ``t_prefill_end``) ->
RLD's first token (its REPORT's ``t_first_token``, when RLD sent token 0),
on the same system-wide monotonic clock; None if RLD emitted nothing.

``kv_at_md``: when MD held the request's KV, as the router predicted it at
routing and as it happened (MD's KV_DONE), both in seconds after routing
(``t_route``; every role process of a run reads the same system-wide
monotonic clock); ``*_wan_s`` the same from P's prefill end (the router's
predicted prefill end; P's reported one). None where a part is missing
(no WAN path, the transfer was cancelled).

Status: ``completed`` only if DONE arrived and every position in
[0, max_out) arrived exactly once; otherwise ``failed`` with the first
reason that applies (the ERROR's reason, timeout, lost or duplicated
positions). Times are ``testbed.clock.now()`` (the loop's clock); token times are relative to
``t_sent``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed import clock
from testbed.decision import Decision, Reserve
from testbed.pdd.wire.protocol import HEADER_SIZE, Done, Error, Report, Role, Tokens

PRODUCER_NAMES = {Role.PREFILL: "P", Role.RELAY_DECODE: "RLD", Role.MAIN_DECODE: "MD"}
_ROLE_KEYS = {"PREFILL": "P", "RELAY_DECODE": "RLD", "MAIN_DECODE": "MD", "ROUTER": "router"}


@dataclass(frozen=True)
class ClientRequest:
    """One workload request: replayed at ``arrival_s`` after the run starts."""

    id: int
    arrival_s: float
    prompt: tuple[int, ...]
    max_out: int
    session: int | str = 0
    designed_hit_rate: float | None = None  # the workload's, for the report
    warmup: bool = False  # a warm-up request: sent before the measured ones (router: p-md)


@dataclass(eq=False)
class RequestTrace:
    """Everything the client saw of one request (see the module docstring)."""

    req: ClientRequest
    t_sent: float | None = None
    tokens: dict[int, tuple[int, float, str]] = field(default_factory=dict)
    duplicated: int = 0
    done: bool = False
    failure: str | None = None
    reports: dict[str, dict] = field(default_factory=dict)  # by role key, the router's aside
    decision: Decision | None = None  # the router's REPORT (testbed/decision.py)
    error_code: str | None = None  # the ErrorCode name of an ERROR that ended it
    resumes: int = 0  # times resumed after the router was lost (client.py)
    _resumed_at: tuple[int, float] | None = None  # (first position, when) of a resume
    token_bytes: int = 0

    @property
    def terminal(self) -> bool:
        return self.done or self.failure is not None

    @property
    def expected_reports(self) -> set[str]:
        roles = self.decision.roles if self.decision is not None else ()
        return {"router"} | {_ROLE_KEYS[r] for r in roles}

    @property
    def reports_complete(self) -> bool:
        got = set(self.reports) | ({"router"} if self.decision is not None else set())
        return self.decision is not None and self.expected_reports <= got

    def on_tokens(self, msg: Tokens, now: float) -> None:
        self.token_bytes += HEADER_SIZE + len(msg.encode())
        producer = PRODUCER_NAMES[msg.producer]
        for i, tok in enumerate(msg.token_ids):
            pos = msg.start_position + i
            if pos in self.tokens:
                self.duplicated += 1
            else:
                self.tokens[pos] = (tok, now - self.t_sent, producer)

    def on_report(self, msg: Report) -> None:
        key = _ROLE_KEYS[msg.role.name]
        if key != "router":
            self.reports[key] = msg.data
            return
        try:
            if self._resumed_at is not None and self.decision is not None \
                    and "reserve" not in msg.data:
                # the new router's decision for a resumed request: a round of its own
                new, (k, t) = Decision.read(msg.data), self._resumed_at
                first = self.decision.pipeline
                self.decision = self.decision.with_reserve(Reserve(
                    f"{first}->re-served-{new.pipeline}",
                    f"re-served after the router was lost: {new.reason}",
                    len(self.decision.reserves) + 1, k,
                    "ROUTER", round(t, 6), new.roles, new.mode))
                self._resumed_at = None
            elif "reserve" in msg.data and self.decision is not None:
                # re-served after a decoder was lost: keep the routing decision, add the
                # round; the roles whose REPORTs complete the record are the new round's
                self.decision = self.decision.with_reserve(Reserve.read(msg.data))
            else:
                self.decision = Decision.read(msg.data)
                self._resumed_at = None
        except ValueError as err:
            self.fail(f"the router's decision record is unreadable: {err}")

    def on_message(self, msg, now: float) -> None:
        """A message from the router about this request (TOKENS, DONE, ERROR, REPORT)."""
        if isinstance(msg, Tokens):
            self.on_tokens(msg, now)
        elif isinstance(msg, Done):
            self.done = self.done or self.failure is None
        elif isinstance(msg, Error):
            if not self.terminal:
                self.error_code = msg.code.name
            self.fail(msg.reason)
        elif isinstance(msg, Report):
            self.on_report(msg)

    def resume(self) -> int:
        """The request is sent again after the router was lost: the first position it
        lacks (the positions after it are dropped: the new round sends them again)."""
        k = 0
        while k in self.tokens:
            k += 1
        for p in [p for p in self.tokens if p > k]:
            del self.tokens[p]
        self.resumes += 1
        self._resumed_at = (k, clock.now())
        return k

    def fail(self, reason: str) -> None:
        if not self.terminal:
            self.failure = reason

    def lost_positions(self) -> list[int]:
        return [p for p in range(self.req.max_out) if p not in self.tokens]

    def token_list(self) -> list[list]:
        return [[p, tok, round(t, 6), who] for p, (tok, t, who) in sorted(self.tokens.items())]

    def _status(self) -> tuple[str, str | None]:
        if self.failure is not None:
            return "failed", self.failure
        if not self.done:
            return "failed", "no DONE received"
        lost = self.lost_positions()
        if lost:
            return "failed", f"{len(lost)} token positions lost (first {lost[0]})"
        if self.duplicated:
            return "failed", f"{self.duplicated} token positions received twice"
        return "completed", None

    def _handoff(self, handoff_mode: str) -> dict:
        rld = self.reports.get("RLD", {})
        times = {who: [t for _, t, w in self.tokens.values() if w == who] for who in ("RLD", "MD")}
        stall = None
        if times["RLD"] and times["MD"]:
            stall = round(1000 * (min(times["MD"]) - max(times["RLD"])), 3)
        pipeline = str(self.pipeline())
        relayed = pipeline.startswith("p-rld-md") and "re-served" not in pipeline
        return {"mode": handoff_mode if relayed else None,
                "batches": len(rld.get("handoff_batches", [])), "stall_ms": stall,
                "tokens": rld.get("handoff_tokens", 0)}

    def pipeline(self) -> str | None:
        d = self.decision
        if d is not None and d.reserves:
            return d.reserves[-1].pipeline  # "<first>->re-served-<pipeline>"
        final = self.reports.get("RLD", {}).get("pipeline_final")
        return final or (d.pipeline if d is not None else None)

    def kv_at_md(self) -> dict:
        p, md = (self.reports.get(k, {}) for k in ("P", "MD"))
        routing = self.decision.routing if self.decision is not None else None
        done, p_end = md.get("t_kv_done"), p.get("t_prefill_end")
        out = {"predicted_s": None, "actual_s": None, "predicted_wan_s": None,
               "actual_wan_s": None}
        if routing is None or "MAIN_DECODE" not in self.decision.roles:
            return out
        t_route = routing.t_route
        out["predicted_wan_s"] = routing.predicted_wan_s
        out["predicted_s"] = round(routing.predicted_kv_at_md_s - t_route, 6)
        if done is not None:
            out["actual_s"] = round(done - t_route, 6)
            if p_end is not None:
                out["actual_wan_s"] = round(done - p_end, 6)
        return out

    def relay_overhead_ms(self) -> float | None:
        """P's prefill end -> RLD's first token (both ``testbed.clock.now()`` on this machine,
        from their REPORTs), for a request RLD emitted for; else None."""
        p_end = self.reports.get("P", {}).get("t_prefill_end")
        first = self.reports.get("RLD", {}).get("t_first_token")
        if p_end is None or first is None:
            return None
        return round(1000 * (first - p_end), 3)

    def record(self, mode: str, handoff_mode: str) -> dict:
        """The requests.jsonl line of this request."""
        status, reason = self._status()
        p, rld, md = (self.reports.get(k, {}) for k in ("P", "RLD", "MD"))
        times = [t for _, t, _ in self.tokens.values()]
        first = self.tokens.get(0)
        return {
            "id": self.req.id, "session": self.req.session, "mode": mode,
            "arrival_s": self.req.arrival_s, "designed_hit_rate": self.req.designed_hit_rate,
            "pipeline": self.pipeline(), "prompt_len": len(self.req.prompt),
            "max_out": self.req.max_out, "p_hit_rate": p.get("p_hit_rate"),
            "md_hit_rate": md.get("md_hit_rate"), "status": status, "reason": reason,
            "t_sent": self.t_sent, "ttft_s": first[1] if first else None,
            "e2e_s": max(times) if times else None, "tokens": self.token_list(),
            "tokens_lost": len(self.lost_positions()), "tokens_duplicated": self.duplicated,
            "handoff": self._handoff(handoff_mode),
            "bytes": {"kv_intra": p.get("kv_intra_bytes", rld.get("kv_intra_bytes", 0)),
                      "kv_wan": p.get("kv_wan_bytes", md.get("kv_wan_bytes", 0)),
                      "handoff": rld.get("handoff_bytes", 0), "tokens": self.token_bytes},
            "overruns": {"steps": sum(int(r.get("overruns", 0)) for r in (p, rld, md)),
                         "kv_bytes": p.get("kv_overrun_bytes", 0)},
            "kv_at_md": self.kv_at_md(),
            "relay_overhead_ms": self.relay_overhead_ms(),
            "prompt": list(self.req.prompt), "reports": self.all_reports(),
        }

    def all_reports(self) -> dict[str, dict]:
        """Every REPORT's data by role key, the router's decision as ``router``."""
        if self.decision is None:
            return dict(self.reports)
        return {"router": self.decision.data(), **self.reports}
