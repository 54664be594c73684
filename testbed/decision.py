"""The router's decision record: one declaration for its writer and its readers.

Owns ``Decision`` (what the router REPORTs to the client about one request:
the pipeline and why, the instances, and for a routed request every input
and prediction, ``Routing``) and ``Reserve`` (one round of re-serving after
a decoder was lost). The router (testbed/pdd/roles/router.py) builds them
and sends ``data()``; the client (testbed/pdd/roles/client_record.py) reads
the REPORT back with ``read`` and writes ``data()`` into requests.jsonl under
``reports.router``; the report (testbed/report/hindsight.py, claims*.py)
reads that line with ``Decision.of_record``. ``read`` checks every field
(ValueError naming it). The on-disk keys are docs/pdd-roles.md's; times
are ``time.monotonic()`` seconds of the machine, durations in seconds,
sizes in nominal (unscaled) bytes or tokens. Pure: imports nothing of the
testbed.

Example::

    d = Decision("p-md", "short transfer", "pdd", ("MAIN_DECODE", "PREFILL"))
    Decision.read(d.data()) == d
    Decision.of_record(requests_jsonl_line).routing.predicted_wan_s
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping

_NUMBER, _INT = "number", "int"


def _check(owner: str, key: str, value: object, kind: str) -> object:
    """``value`` as ``kind`` requires (ValueError naming ``owner.key`` otherwise)."""
    is_num = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == _NUMBER and is_num and not math.isnan(value):
        return float(value)
    if kind == _INT and is_num and value == int(value) and math.isfinite(value):
        return int(value)
    if kind == "str" and isinstance(value, str):
        return value
    raise ValueError(f"{owner}.{key}: expected {kind}, got {value!r}")


@dataclass(frozen=True)
class Routing:
    """Every input of one routing decision and the router's prediction.

    ``t_route`` and ``predicted_*_s`` ending in ``_end_s``/``kv_at_md_s`` are
    monotonic times; the rest durations, sizes and counts as named."""

    t_route: float                  # when the router decided
    policy: str                     # the policy that decided (its name or file)
    policy_us: float                # how long the policy took
    predicted_prefill_s: float      # P's prefill of the uncached part
    predicted_prefill_end_s: float  # P's queue included
    predicted_wan_s: float          # P's prefill end -> KV at MD (WanModel.predict)
    predicted_kv_at_md_s: float     # the time MD is expected to hold the KV
    predicted_local_s: float        # P's prefill end -> KV at RLD (LocalModel)
    late_kv_wan_s: float            # the prediction with capacity returning to line rate
    wan_gbit: float                 # the WAN capacity the prediction used
    wan_gbit_recovered: float       # the same for late_kv_wan_s
    wan_rtt_s: float
    wan_overhead_s: float
    wan_queue_delay_s: float
    wan_capacity_age_s: float       # how old the capacity measurement was
    wan_backlog_bytes: int          # KV bytes ahead of this one on the WAN
    wan_backlog_transfers: int
    wan_margin_s: float             # what the threshold test adds (WanModel.margin_s)
    wan_margin_samples: int         # prediction errors the margin is made of
    wan_nominal_bytes: float        # this request's KV bytes on the WAN
    wan_retrans_share: float        # measured retransmitted share of P's segments
    wan_retrans_segments: int
    wan_rto_s: float
    local_backlog_bytes: int
    local_backlog_transfers: int
    inflight_shared_tokens: int     # prompt shared with a transfer still on its way to MD
    router_hit_tokens: int          # P's cache hit, as the router's mirror has it
    router_md_hit_tokens: int       # MD's, likewise
    rld_active: int                 # sequences on RLD when decided
    rld_held_tokens: int            # modeled KV tokens held on RLD
    rld_budget_max_batch: int
    rld_budget_kv_tokens: int
    rld_decode_s: float             # RLD decoding every token of this request

    def data(self) -> dict:
        out = dataclasses.asdict(self)
        out["rld_budget"] = {"max_batch": out.pop("rld_budget_max_batch"),
                             "kv_tokens": out.pop("rld_budget_kv_tokens")}
        return out

    @classmethod
    def read(cls, data: Mapping) -> "Routing":
        budget = data.get("rld_budget")
        if not isinstance(budget, Mapping):
            raise ValueError(f"decision.rld_budget: expected an object, got {budget!r}")
        flat = dict(data, rld_budget_max_batch=budget.get("max_batch"),
                    rld_budget_kv_tokens=budget.get("kv_tokens"))
        kinds = {"float": _NUMBER, "int": _INT, "str": "str"}
        return cls(**{f.name: _check("decision", f.name, flat.get(f.name), kinds[f.type])
                      for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class Reserve:
    """One round of re-serving a request after a decoder was lost."""

    pipeline: str          # "<first pipeline>->re-served-<this round's>"
    reason: str
    round: int             # 1, 2, ...
    from_position: int     # the client position this round starts at
    lost: str              # the role lost (MAIN_DECODE, RELAY_DECODE)
    t: float               # when the router re-served (monotonic)
    roles: tuple[str, ...]  # this round's roles
    mode: str

    def data(self) -> dict:
        return {"pipeline": self.pipeline, "reason": self.reason,
                "reserve": {"round": self.round, "from_position": self.from_position,
                            "lost": self.lost, "t": self.t},
                "roles": list(self.roles), "mode": self.mode}

    @classmethod
    def read(cls, data: Mapping) -> "Reserve":
        inner = data.get("reserve")
        if not isinstance(inner, Mapping):
            raise ValueError(f"reserve.reserve: expected an object, got {inner!r}")
        own = "reserve"
        return cls(_check(own, "pipeline", data.get("pipeline"), "str"),
                   _check(own, "reason", data.get("reason"), "str"),
                   _check(own, "round", inner.get("round"), _INT),
                   _check(own, "from_position", inner.get("from_position"), _INT),
                   _check(own, "lost", inner.get("lost"), "str"),
                   _check(own, "t", inner.get("t"), _NUMBER),
                   _roles(own, data.get("roles")), _check(own, "mode", data.get("mode"), "str"))


def _placement(value: object) -> dict[str, dict[str, dict[str, float]]]:
    """A decision's ``placement`` (absent in records made before it: {})."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"decision.placement: expected an object, got {value!r}")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for role, insts in value.items():
        if not isinstance(insts, Mapping):
            raise ValueError(f"decision.placement.{role}: expected an object, got {insts!r}")
        out[role] = {}
        for name, figures in insts.items():
            if not isinstance(figures, Mapping):
                raise ValueError(f"decision.placement.{role}.{name}: expected an object, "
                                 f"got {figures!r}")
            out[role][name] = {k: _check(f"decision.placement.{role}.{name}", k, v, _NUMBER)
                               for k, v in figures.items()}
    return out


def _roles(owner: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(r, str) for r in value):
        raise ValueError(f"{owner}.roles: expected a list of role names, got {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class Decision:
    """The router's record of one request: routed (``routing`` set), or refused or
    ended before it was bound (``pipeline`` None, ``reason`` says why)."""

    pipeline: str | None     # p-md, p-rld-md, rld-only; None: refused before routing
    reason: str
    mode: str
    roles: tuple[str, ...] = ()          # the roles of the pipeline (Role names)
    instances: dict[str, str | None] = field(default_factory=dict)  # role -> instance
    routing: Routing | None = None
    reserves: tuple[Reserve, ...] = ()   # rounds re-served after a decoder was lost
    # the candidates the placement chose among: role -> instance -> figures (P:
    # prefill_end_s, hit_tokens; a decoder: active, held_tokens, transfer_s, decode_s)
    placement: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # bound late (the request waited in P's queue; decided when its prefill started, at
    # t_route): when it arrived (monotonic); None: decided on arrival
    t_arrival: float | None = None

    @property
    def refused(self) -> bool:
        return self.pipeline is None

    def with_reserve(self, reserve: Reserve) -> "Decision":
        """This decision with a re-served round added; the new round's roles are the
        ones whose REPORTs complete the record."""
        return dataclasses.replace(self, reserves=self.reserves + (reserve,), roles=reserve.roles)

    def data(self) -> dict:
        out = {"pipeline": self.pipeline, "reason": self.reason, "roles": list(self.roles),
               "mode": self.mode}
        if self.instances:
            out["instances"] = dict(self.instances)
        if self.routing is not None:
            out.update(self.routing.data())
        if self.reserves:
            out["reserves"] = [r.data() for r in self.reserves]
        if self.placement:
            out["placement"] = {role: {name: dict(f) for name, f in insts.items()}
                                for role, insts in self.placement.items()}
        if self.t_arrival is not None:
            out["t_arrival"] = self.t_arrival
        return out

    @classmethod
    def read(cls, data: Mapping) -> "Decision":
        pipeline = data.get("pipeline")
        if pipeline is not None:
            _check("decision", "pipeline", pipeline, "str")
        instances = data.get("instances", {})
        if not isinstance(instances, Mapping) or not all(
                isinstance(v, (str, type(None))) for v in instances.values()):
            raise ValueError(f"decision.instances: expected role -> instance name, "
                             f"got {instances!r}")
        reserves = data.get("reserves", [])
        if not isinstance(reserves, list):
            raise ValueError(f"decision.reserves: expected a list, got {reserves!r}")
        return cls(pipeline, _check("decision", "reason", data.get("reason"), "str"),
                   _check("decision", "mode", data.get("mode"), "str"),
                   _roles("decision", data.get("roles")), dict(instances),
                   Routing.read(data) if "t_route" in data else None,
                   tuple(Reserve.read(r) for r in reserves), _placement(data.get("placement")),
                   None if data.get("t_arrival") is None
                   else _check("decision", "t_arrival", data["t_arrival"], _NUMBER))

    @classmethod
    def of_record(cls, record: Mapping) -> "Decision | None":
        """The decision in a requests.jsonl line; None when the line has none (the
        router's REPORT never arrived)."""
        data = (record.get("reports") or {}).get("router")
        return None if not data else cls.read(data)
