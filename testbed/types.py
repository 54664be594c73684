"""One enum per concept shared across packages (vidur's ``types/``).

Mode: what the router may choose; Pipeline: the path of one request;
HandoffMode: how RLD hands over; Sla: a scenario's per-request service
bounds, as the spec reads them and the report applies them; FaultEvent: a
fault's start or end as runner, collector and report read it. The link
Backend lives with the shaping arithmetic (testbed.net.shaping); role names
in topologies are testbed.spec.topology.Role and on the wire
testbed.pdd.wire.fields.Role (an integer encoding of the same roles).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping


class Mode(enum.Enum):
    """What the router may choose (docs/pdd-roles.md, Pipelines)."""

    PDD = "pdd"  # p-md or p-rld-md by expected WAN time; anomalous filter -> rld-only
    CROSS_DC_PD = "cross-dc-pd"  # baseline: every request p-md over the WAN
    SAME_DC_PD = "same-dc-pd"  # baseline: every request rld-only (RLD as a same-DC decoder)
    P_RLD = "p-rld"  # excluded design: low-hit requests rld-only, the rest p-md


# the router's built-in policies (testbed/pdd/policy/): the four modes' rules and three
# alternatives; a scenario's mode may name one, or a user's `path.py:Name`
POLICIES = ("pdd", "cross-dc-pd", "same-dc-pd", "p-rld", "always-relay", "never-relay",
            "prompt-threshold")


def is_file_policy(spec: str) -> bool:
    """``path.py:Name`` (a user's policy file), not a built-in policy's name."""
    path, sep, name = spec.rpartition(":")
    return bool(sep and path.endswith(".py") and name.isidentifier())


class Pipeline(enum.Enum):
    P_MD = "p-md"
    P_RLD_MD = "p-rld-md"
    RLD_ONLY = "rld-only"


class HandoffMode(enum.Enum):
    ONE_SHOT = "one-shot"
    CATCH_UP = "catch-up"


# The compute engines a role may run (testbed/pdd/compute/engine.py): the tiny torch
# decoder, or the model-free hash chain (microseconds per token).
ENGINES = ("torch", "hash")


@dataclass(frozen=True)
class PddSettings:
    """The PDD settings, declared once: what a scenario's ``pdd:`` sets
    (testbed/spec/scenario.py parses into this type), what a bare role config
    file defaults to (testbed/pdd/run/config.py reads ``PDD_DEFAULTS``) and
    what the report assumes for a run that did not record one; so a scenario
    that leaves a field out runs the roles with the value a role config file
    would get. The role config groups the same names by role (``relay``,
    ``router``, ``timing``, ``client``; testbed/scenario/cluster_config.py)."""

    kv_bytes_per_token: int = 50_000          # modeled big model's KV per token (nominal)
    token_scale: int = 32                     # modeled prompt tokens per real (tiny-model) token
    handoff_mode: HandoffMode = HandoffMode.CATCH_UP
    catchup_threshold_tokens: int = 64        # catch-up: a batch of at most this many is final
    anomalous_filter: bool = True             # long input + short output -> rld-only
    late_kv_local: bool = True                # rld-only when the KV would reach MD after the end
    anomalous_min_input_tokens: int = 65536   # modeled prompt tokens (real x token_scale) >=
    anomalous_max_output_tokens: int = 500    # the paper: under 500 output tokens (docs/paper.md)
    relay_threshold_s: float = 0.5            # relay when it gains at least this
    relay_margin_quantile: float = 0.9        # quantile of recent prediction errors added
    time_scale: float = 1.0                   # multiplies every modeled compute time
    request_timeout_s: float = 120.0          # a request not finished this long after sending fails
    drc: bool = True                          # MD's decode-side prefix cache; false: every
                                              # request's whole KV crosses the WAN (claim 3)
    engine: str = "torch"                     # the roles' compute engine, one of ENGINES


PDD_DEFAULTS = PddSettings()


@dataclass(frozen=True)
class Sla:
    """Per-request service bounds: a request meets them when its TTFT and TPOT are
    within them; None = not checked (a run that recorded no ``sla``). A scenario
    without ``sla:`` gets ``SCENARIO_SLA`` (testbed/spec/scenario.py)."""

    ttft_s: float | None = None
    tpot_ms: float | None = None

    @classmethod
    def from_resolved(cls, resolved: Mapping) -> "Sla":
        """The ``sla: {ttft_s, tpot_ms}`` of a resolved scenario (metadata.json), or no
        bounds."""
        sla = resolved.get("sla") or {}
        return cls(sla.get("ttft_s"), sla.get("tpot_ms"))

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_ms is None


SCENARIO_SLA = Sla(ttft_s=2.0, tpot_ms=200.0)  # a scenario's bounds when it sets none


# The protocol events a role writes to its events file (``python -m testbed.pdd.run.node
# --events``; testbed/pdd/roles/peers.py ``RoleServer.protocol_event``) and a fault may be
# triggered by (a scenario fault's ``trigger:``, testbed/spec/triggers.py), with who writes each.
PROTOCOL_EVENTS = {
    "handoff_sent": "RLD sent MD a HANDOFF batch (before MD's ACK)",
    "handoff_final": "RLD sent the final HANDOFF batch (catch-up's last batch, one-shot's only)",
    "handoff_acked": "MD acknowledged a HANDOFF batch",
    "kv_transfer_half": "P has sent half of a request's KV to MD (the WAN transfer mid-way)",
    "kv_done": "MD holds a request's whole KV (P's KV_DONE arrived)",
}

FAULT_EDGES = ("start", "end")
# keys of a fault event record that are not the fault's parameters
_FAULT_EVENT_KEYS = ("t_mono", "t_wall", "kind", "fault", "fault_kind", "link", "planned")


@dataclass(frozen=True)
class FaultEvent:
    """A fault's start or end in a run's events.jsonl: one shape for the runner
    (testbed.scenario.faults) and the cluster collector (testbed.export.collect),
    read by the report (testbed.report.events).

    On disk (docs/run-directory.md): ``{"kind": "fault_start"|"fault_end",
    "fault": index, "fault_kind": the scenario's kind, "link": ..., **params}``;
    ``planned: true`` when the time is the Workflow's plan, not an observation.
    Example::

        FaultEvent("start", 0, "bandwidth", "wan", {"rate_gbit": 2.0}).record()
    """

    edge: str            # "start" | "end"
    fault: int           # the fault's index in the scenario's faults list
    fault_kind: str      # the scenario's kind: bandwidth, kill, ... (testbed/spec/faultkinds)
    link: str = "wan"
    params: dict = field(default_factory=dict)  # the kind's parameters, plain data
    planned: bool = False

    def __post_init__(self) -> None:
        if self.edge not in FAULT_EDGES:
            raise ValueError(f"fault event edge {self.edge!r}: expected one of {FAULT_EDGES}")
        clash = sorted(set(self.params) & set(_FAULT_EVENT_KEYS))
        if clash:
            raise ValueError(f"fault event params {clash}: names the record itself uses")

    @property
    def event_kind(self) -> str:
        return f"fault_{self.edge}"

    def record(self) -> dict:
        """The fields of the events.jsonl record (without its times)."""
        out = {"kind": self.event_kind, "fault": self.fault, "fault_kind": self.fault_kind,
               "link": self.link, **self.params}
        if self.planned:
            out["planned"] = True
        return out

    @classmethod
    def read(cls, rec: Mapping) -> "FaultEvent | None":
        """The fault event in an events.jsonl record, None when it is none."""
        kind = rec.get("kind")
        if kind not in ("fault_start", "fault_end") or not isinstance(rec.get("fault"), int):
            return None
        return cls(kind.removeprefix("fault_"), rec["fault"], str(rec.get("fault_kind") or ""),
                   str(rec.get("link") or "wan"),
                   {k: v for k, v in rec.items() if k not in _FAULT_EVENT_KEYS},
                   bool(rec.get("planned", False)))
