"""Cluster and role configuration of the PDD processes: one JSON file, strictly validated.

Owns one frozen dataclass per config section (fields carry help text), and the one
loader ``load_config`` / ``parse_config``. Every role process reads the same
file and picks its own instance by name. The PDD design's enums (``Mode``,
``Pipeline``, ``HandoffMode``) live in testbed/types.py (import them from
there); unknown keys, wrong types and
out-of-range values raise ``SpecError`` naming the file, the JSON path, what
was expected and what was found. Validation is pure (no I/O beyond reading
the file); the JSON is read strictly (testbed.strict: no NaN, no
duplicate keys, bounded nesting) and numbers must be finite and int64-sized.

Example file (every section but ``instances`` may be left out)::

    {"mode": "pdd",
     "model": {"d_model": 64, "n_layer": 2, "n_head": 2},
     "timing": {"time_scale": 0.5, "kv_scale_k": 10},
     "relay": {"handoff_mode": "catch-up", "catchup_threshold_tokens": 64},
     "instances": [
       {"name": "p0", "role": "prefill", "host": "127.0.0.1", "port": 7101, "dc": "A"},
       {"name": "rld0", "role": "relay_decode", "host": "127.0.0.1", "port": 7102, "dc": "A"},
       {"name": "md0", "role": "main_decode", "host": "127.0.0.1", "port": 7103, "dc": "B"},
       {"name": "router", "role": "router", "host": "127.0.0.1", "port": 7100, "dc": "A"}]}
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from testbed.errors import SpecError
from testbed.strict import MAX_INT, finite, parse_json, read_text
from testbed.pdd.compute.costmodel import GPU_A, GPU_B, CostModel, ModelProfile
from testbed.pdd.compute.engine import ModelConfig
from testbed.pdd.wire.fields import Role
from testbed.types import PDD_DEFAULTS as _D
from testbed.types import HandoffMode, Mode

# The tiny model the roles run in a scenario (testbed/scenario/cluster_config.py)
# and in client_bench: small enough that real compute stays below the modeled
# step times on 2 cores (float64: exact tokens).
RUN_MODEL = {"n_layer": 2, "n_head": 2, "d_model": 64}

# One instance of each role (P, RLD, router and client in DC A, MD in DC B), the smallest
# whole cluster; ``one_of_each`` places them.
ONE_OF_EACH = (("p0", "prefill", "A"), ("rld0", "relay_decode", "A"),
               ("md0", "main_decode", "B"), ("router", "router", "A"), ("client", "client", "A"))


def one_of_each(host: Callable[[str], str] = lambda name: "127.0.0.1",
                port: Callable[[str], int | None] = lambda name: 1) -> list[dict]:
    """The ``instances`` of ONE_OF_EACH as config JSON: ``host(name)``, ``port(name)``
    (a client gets no port)."""
    return [{"name": n, "role": r, "host": host(n), "dc": dc,
             **({} if r == "client" else {"port": port(n)})} for n, r, dc in ONE_OF_EACH]


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a default_factory")
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class Instance:
    """One role process: where it listens and in which datacenter."""

    name: str = _f("", "unique instance name; a process is started with it", required=True)
    role: Role = _f(Role.CLIENT, "prefill | relay_decode | main_decode | router | client",
                    required=True)
    host: str = _f("127.0.0.1", "address to listen on and to be reached at")
    port: int = _f(0, "TCP port (clients need none)", lo=0, hi=65535)
    dc: str = _f("A", "datacenter: A (P, RLD, router, client) or B (MD)", choices=("A", "B"))


@dataclass(frozen=True)
class TimingConfig:
    """How real compute is padded to the modeled big model, and how sizes are scaled."""

    time_scale: float = _f(_D.time_scale, "multiplies every modeled compute duration (prefill, decode "
                           "step, extend); < 1 runs faster than the modeled hardware", lo=1e-6)
    kv_scale_k: float = _f(10.0, "bandwidth scale k: KV payloads are modeled bytes / k", lo=1.0)
    kv_bytes_per_token: int = _f(_D.kv_bytes_per_token, "modeled KV bytes per token", lo=1)
    token_scale: int = _f(_D.token_scale, "modeled prompt tokens per real (tiny-model) token: KV bytes and "
                          "compute contexts are token_scale x the tiny model's; output tokens "
                          "are 1:1", lo=1)
    n_chips: int = _f(4, "chips per P / RLD / MD instance", lo=1)
    connect_timeout_s: float = _f(10.0, "how long a role retries connecting to a peer", lo=0.0)

    def cost(self, role: Role) -> CostModel:
        """GPU_A for P and RLD, GPU_B for MD."""
        chip = GPU_B if role == Role.MAIN_DECODE else GPU_A
        profile = ModelProfile(kv_bytes_per_token=self.kv_bytes_per_token)
        return CostModel(chip, profile, self.n_chips, self.token_scale)

    def modeled_kv_bytes(self, n_tokens: int) -> int:
        """Bytes that n (real) tokens of KV take on the wire:
        ``n * token_scale * kv_bytes_per_token / k``."""
        return int(n_tokens * self.token_scale * self.kv_bytes_per_token / self.kv_scale_k)


@dataclass(frozen=True)
class PrefillConfig:
    block_size: int = _f(16, "prefix-cache block (P's cache, MD's DRC, router mirror)", lo=1)
    cache_capacity_tokens: int = _f(65536, "P's prefix cache capacity", lo=0)
    kv_chunk_tokens: int = _f(64, "tokens of KV per KV_CHUNK frame", lo=1)
    layerwise_local: bool = _f(True, "the local (RDMA) path to RLD streams the KV while the "
                               "prefill runs, as layers complete; the WAN path starts after")
    tcp_status_interval_s: float = _f(0.1, "how often P tells the router the TCP segments "
                                      "its connections to MD sent and retransmitted (the "
                                      "router's measure of WAN loss)", lo=0.005)


@dataclass(frozen=True)
class RelayConfig:
    handoff_mode: HandoffMode = _f(_D.handoff_mode, "one-shot | catch-up")
    catchup_threshold_tokens: int = _f(_D.catchup_threshold_tokens,
                                       "catch-up: a batch of at most this many tokens is final",
                                       lo=0)
    catchup_max_batches: int = _f(8, "catch-up: the batch with this number (1-based) is final "
                                  "whatever its size, so a slow WAN cannot loop forever", lo=1)


@dataclass(frozen=True)
class MainConfig:
    drc_capacity_tokens: int = _f(65536, "MD's decode-side radix cache capacity", lo=0)
    wan_status_interval_s: float = _f(0.1, "how often MD tells the router the KV bytes it "
                                      "received and what each transfer still misses", lo=0.005)
    extend_chunk_tokens: int = _f(32, "catch-up's earlier handoff batches are recomputed at "
                                  "most this many tokens per decode step (chunked, like "
                                  "chunked prefill), so a final batch waits for one chunk at "
                                  "most; 0: whole batches", lo=0)


@dataclass(frozen=True)
class RouterConfig:
    policy: str = _f("", "the routing policy: a built-in (testbed.types.POLICIES) or "
                     "path/to/file.py:Name (testbed/pdd/policy/base.py); empty: the mode's "
                     "own (pdd, cross-dc-pd, same-dc-pd or p-rld)")
    policy_params: dict = field(default_factory=dict, metadata={
        "help": "the policy's parameters (its constructor's keyword arguments)"})
    relay_threshold_s: float = _f(_D.relay_threshold_s, "pdd: relay (p-rld-md) when the predicted WAN KV time "
                                  "(prefill end -> KV at MD, plus the margin) exceeds the "
                                  "predicted local one (KV at RLD) by at least this", lo=0.0)
    relay_margin_quantile: float = _f(_D.relay_margin_quantile, "pdd: the threshold test uses the prediction plus "
                                      "this quantile of recent near-threshold prediction "
                                      "errors (actual - predicted); 0: the prediction alone",
                                      lo=0.0, hi=1.0)
    relay_margin_window_s: float = _f(10.0, "pdd: the margin's errors are those of transfers "
                                      "whose KV reached MD at most this long ago (a fault's "
                                      "errors stop counting this long after it)", lo=0.1)
    lossy_wan_retrans_pct: float = _f(1.0, "pdd: while P's connections to MD retransmitted at "
                                      "least this share of their segments (percent) over "
                                      "lossy_wan_window_s, the short-transfer test is "
                                      "skipped: under random loss a transfer's time is set "
                                      "by retransmission timeouts no rate estimate predicts, "
                                      "so every request RLD has room for is relayed; "
                                      "0: off", lo=0.0, hi=100.0)
    lossy_wan_window_s: float = _f(5.0, "pdd: the window of lossy_wan_retrans_pct", lo=0.1)
    lossy_wan_min_segments: int = _f(200, "pdd: fewer segments sent in the window measure "
                                     "no loss share (the share is 0)", lo=1)
    rld_max_active: int = _f(0, "pdd: RLD takes at most this many requests; 0: only the "
                             "cost model's budget (batch and KV memory)", lo=0)
    rld_step_budget_ms: float = _f(50.0, "RLD's batch is capped where its modeled decode step "
                                   "(unscaled) would exceed this", lo=1.0)
    anomalous_filter: bool = _f(_D.anomalous_filter, "long input + short output -> rld-only (no WAN)")
    late_kv_local: bool = _f(_D.late_kv_local, "pdd: rld-only (no WAN transfer) when the KV would reach MD "
                             "after RLD has decoded every token")
    anomalous_min_input_tokens: int = _f(_D.anomalous_min_input_tokens, "anomalous filter: modeled prompt length "
                                         "(tokens x token_scale) >=", lo=1)
    anomalous_max_output_tokens: int = _f(_D.anomalous_max_output_tokens, "anomalous filter: max output <", lo=1)
    wan_prior_gbit: float = _f(10.0, "the WAN line rate, nominal Gbit/s: the capacity "
                               "estimate before MD's first busy interval, and its ceiling",
                               lo=1e-9)
    wan_rtt_s: float = _f(0.1, "WAN round-trip time before the first probe", lo=0.0)
    local_gbit: float = _f(100.0, "the local path P -> RLD's line rate, nominal Gbit/s (the "
                           "slower of P's and RLD's host links): the router's local-path "
                           "model (local_model)", lo=1e-9)
    wan_window_min_s: float = _f(0.5, "capacity = bytes / busy time of MD's busy intervals "
                                 "over max(this, wan_window_rtts x RTT)", lo=0.01)
    wan_window_rtts: float = _f(5.0, "capacity window in RTTs (see wan_window_min_s)", lo=0.0)
    wan_recovery_half_life_s: float = _f(5.0, "the late-KV rule (rld-only, nothing crosses) "
                                         "predicts on the capacity estimate returning toward "
                                         "wan_prior_gbit with this half-life while no busy "
                                         "interval measures it (a stalled spell's ~0 does not "
                                         "lock in)", lo=0.01)
    rtt_probe_interval_s: float = _f(0.1, "the router pings each MD this often", lo=0.01)
    rtt_window_s: float = _f(2.0, "RTT = min of the probes of this window", lo=0.01)
    revive_interval_s: float = _f(0.5, "the router tries to reconnect to a lost instance this "
                                  "often (a restarted process is used again)", lo=0.01)


@dataclass(frozen=True)
class ClientConfig:
    request_timeout_s: float = _f(_D.request_timeout_s, "a request not finished this long after sending fails",
                                  lo=0.0)
    report_grace_s: float = _f(2.0, "after the last request ends, wait this long for REPORTs",
                               lo=0.0)
    max_open_requests: int = _f(0, "the OpenAI gateway: requests it keeps open at once (from "
                                "admission until the roles' REPORTs say they let it go); "
                                "the next ones queue (max_queued_requests), and are "
                                "answered 429 with Retry-After before they reach the "
                                "router when the queue is full or their wait ran out. "
                                "0: auto, the "
                                "router's limits.max_requests (beyond which the router "
                                "refuses anyway)", lo=0)
    max_queued_requests: int = _f(0, "the OpenAI gateway: requests that may wait, first "
                                  "come first admitted, for one of max_open_requests' slots "
                                  "(their bodies not yet parsed); one beyond is "
                                  "answered 429 at once. 0: auto, as many as "
                                  "max_open_requests", lo=0)
    queue_timeout_s: float = _f(10.0, "the OpenAI gateway: a queued request not admitted "
                                "within its wait, drawn uniformly from [this / 2, this] "
                                "(a crowd that came together is not refused together), is "
                                "answered 429; 0: no queue, a request beyond "
                                "max_open_requests is answered 429 at once", lo=0.0)
    retry_after_s: float = _f(1.0, "the OpenAI gateway: the Retry-After of a 429", lo=0.0)


@dataclass(frozen=True)
class LimitsConfig:
    """Bounds every role process puts on what a peer may make it hold (docs/pdd-roles.md,
    Bounded resources). A peer that breaks one loses its connection; the role serves on."""

    max_frame_bytes: int = _f(0, "any frame, header + payload + filler (a KV_CHUNK of "
                              "modeled size); checked on the header. 0: auto, the larger of "
                              "64 MiB and twice this config's largest KV_CHUNK (the filler "
                              "is never buffered: this bounds time, not memory)", lo=0)
    max_kv_payload_bytes: int = _f(32 << 20, "a KV_CHUNK's real KV bytes (buffered until the "
                                   "frame is in; the filler is never buffered)", lo=64)
    max_control_payload_bytes: int = _f(1 << 20, "the payload of every other variable-size "
                                        "type (HELLO, REQUEST, TOKENS, HANDOFF, ERROR, REPORT); "
                                        "fixed-layout types must have exactly their size",
                                        lo=64)
    frame_timeout_s: float = _f(60.0, "a frame whose first bytes arrived must be complete "
                                "within this much waiting, else the connection is closed; "
                                "0: no timeout", lo=0.0)
    hello_timeout_s: float = _f(10.0, "an accepted connection that has not sent HELLO within "
                                "this is closed; until then it may send HELLO only; 0: no "
                                "timeout", lo=0.0)
    max_connections: int = _f(256, "a role's listener closes connections beyond this many "
                              "open ones at once", lo=1)
    max_strangers: int = _f(0, "of max_connections, how many may be strangers: connections "
                            "that have not sent HELLO yet or whose HELLO names no configured "
                            "instance; a new connection beyond closes the oldest one without "
                            "HELLO. 0: auto, max_connections minus 4 per configured instance "
                            "(at least 1)", lo=0)
    max_connections_per_address: int = _f(32, "strangers' connections one peer address may "
                                          "hold; a new one beyond closes that address's "
                                          "oldest without HELLO", lo=1)
    max_requests: int = _f(512, "requests a role holds at once (each holds a KV cache of up "
                           "to prompt + max output tokens); a REQUEST beyond gets "
                           "ERROR(OVERLOADED)", lo=1)


@dataclass(frozen=True)
class ClusterConfig:
    """Everything a PDD role process needs; ``instances`` lists every process."""

    instances: tuple[Instance, ...] = field(default=(), metadata={"help": "every role process"})
    mode: Mode = _f(Mode.PDD, "pdd | cross-dc-pd | same-dc-pd | p-rld")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "tiny model"})
    timing: TimingConfig = field(default_factory=TimingConfig, metadata={"help": "pacing"})
    prefill: PrefillConfig = field(default_factory=PrefillConfig, metadata={"help": "P"})
    relay: RelayConfig = field(default_factory=RelayConfig, metadata={"help": "RLD"})
    main: MainConfig = field(default_factory=MainConfig, metadata={"help": "MD"})
    router: RouterConfig = field(default_factory=RouterConfig, metadata={"help": "router"})
    client: ClientConfig = field(default_factory=ClientConfig, metadata={"help": "client"})
    limits: LimitsConfig = field(default_factory=LimitsConfig,
                                 metadata={"help": "bounds against broken or hostile peers"})

    def instance(self, name: str) -> Instance:
        for inst in self.instances:
            if inst.name == name:
                return inst
        raise KeyError(f"no instance named {name!r}")

    def of_role(self, role: Role) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.role == role)


_NEEDS = {  # roles each mode needs at least one of
    Mode.PDD: (Role.PREFILL, Role.RELAY_DECODE, Role.MAIN_DECODE, Role.ROUTER),
    Mode.CROSS_DC_PD: (Role.PREFILL, Role.MAIN_DECODE, Role.ROUTER),
    Mode.SAME_DC_PD: (Role.PREFILL, Role.RELAY_DECODE, Role.ROUTER),
    Mode.P_RLD: (Role.PREFILL, Role.RELAY_DECODE, Role.MAIN_DECODE, Role.ROUTER),
}


def _parse_value(tp: Any, value: Any, file: str, path: str, meta: dict) -> Any:
    def bad(expected: str) -> SpecError:
        return SpecError(file, path, expected, value)

    if dataclasses.is_dataclass(tp):
        return parse_section(tp, value, file, path)
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, list):
            raise bad("a list")
        item = typing.get_args(tp)[0]
        return tuple(_parse_value(item, v, file, f"{path}[{i}]", meta)
                     for i, v in enumerate(value))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        names = ([m.name.lower() for m in tp] if tp is Role else [m.value for m in tp])
        if value not in names:
            raise bad(" | ".join(names))
        return tp[value.upper()] if tp is Role else tp(value)
    if tp is dict:
        if not isinstance(value, dict):
            raise bad("an object")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if tp in (int, float):
        ok = isinstance(value, int) or (tp is float and isinstance(value, float))
        if not ok or isinstance(value, bool):
            raise bad("an integer" if tp is int else "a number")
        if not finite(value) or abs(value) > MAX_INT:
            raise bad(f"a finite number of magnitude at most {MAX_INT}")
        if value < meta.get("lo", float("-inf")) or value > meta.get("hi", float("inf")):
            raise bad(f"a value in [{meta.get('lo', '-inf')}, {meta.get('hi', 'inf')}]")
        return tp(value)
    if tp is str:
        if not isinstance(value, str) or ("choices" in meta and value not in meta["choices"]):
            raise bad(" | ".join(meta["choices"]) if "choices" in meta else "a string")
        return value
    raise TypeError(f"config field type {tp!r} is not supported")


def parse_section(cls: type, obj: Any, file: str, path: str) -> Any:
    """Build dataclass ``cls`` from a JSON object; unknown keys are errors."""
    if not isinstance(obj, dict):
        raise SpecError(file, path, f"an object ({cls.__name__})", obj)
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in obj:
        if key not in known:
            raise SpecError(file, f"{path}.{key}".lstrip("."),
                            f"one of {sorted(known)}", "an unknown key")
    for name, fld in known.items():
        if fld.metadata.get("required") and name not in obj:
            raise SpecError(file, f"{path}.{name}".lstrip("."), "a value (required)", None)
    values = {k: _parse_value(hints[k], v, file, f"{path}.{k}".lstrip("."),
                              dict(known[k].metadata)) for k, v in obj.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError, ArithmeticError) as err:  # __post_init__ checks
        raise SpecError(file, path, f"a valid {cls.__name__}", str(err)) from None


def _check_instances(cfg: ClusterConfig, file: str) -> None:
    names = [i.name for i in cfg.instances]
    for k, inst in enumerate(cfg.instances):
        if not inst.name:
            raise SpecError(file, f"instances[{k}].name", "a non-empty name", inst.name)
        if inst.name in names[:k]:
            raise SpecError(file, f"instances[{k}].name", "a unique name", inst.name)
        if inst.role != Role.CLIENT and inst.port == 0:
            raise SpecError(file, f"instances[{k}].port", "a port for a listening role", 0)
    for role in _NEEDS[cfg.mode]:
        if not cfg.of_role(role):
            raise SpecError(file, "instances", f"at least one {role.name.lower()} instance "
                            f"for mode {cfg.mode.value}", names)
    if len(cfg.of_role(Role.ROUTER)) != 1:
        raise SpecError(file, "instances", "exactly one router", names)


def kv_chunk_bounds(cfg: ClusterConfig) -> tuple[int, int]:
    """(largest real KV payload, largest frame) of the KV_CHUNKs this config makes:
    ``prefill.kv_chunk_tokens`` tokens of the tiny model's KV, at their modeled size."""
    n = cfg.prefill.kv_chunk_tokens
    real = 12 + 64 + n * cfg.model.kv_wire_bytes_per_token  # ranges, cache header
    frame = 29 + max(real, 12 + cfg.timing.modeled_kv_bytes(n))  # header, ranges, data + filler
    return real, frame


def frame_limit(cfg: ClusterConfig) -> int:
    """``limits.max_frame_bytes``, or its auto value (0): max(64 MiB, 2 x largest KV_CHUNK)."""
    return cfg.limits.max_frame_bytes or max(64 << 20, 2 * kv_chunk_bounds(cfg)[1])


def _check_limits(cfg: ClusterConfig, file: str) -> None:
    """The limits must let through the KV_CHUNKs this very config makes."""
    real, frame = kv_chunk_bounds(cfg)
    lim = cfg.limits
    if real > lim.max_kv_payload_bytes:
        raise SpecError(file, "limits.max_kv_payload_bytes", f">= {real} (the real KV of "
                        f"{cfg.prefill.kv_chunk_tokens} tokens, prefill.kv_chunk_tokens)",
                        lim.max_kv_payload_bytes)
    if lim.max_frame_bytes and frame > lim.max_frame_bytes:
        raise SpecError(file, "limits.max_frame_bytes", f">= {frame} (a KV_CHUNK of "
                        f"{cfg.prefill.kv_chunk_tokens} tokens at its modeled size)",
                        lim.max_frame_bytes)


def parse_config(obj: Any, file: str = "<config>") -> ClusterConfig:
    """Validate a JSON object as a ``ClusterConfig``.

    Example: ``parse_config(json.load(open("cluster.json")), "cluster.json")``.
    """
    cfg = parse_section(ClusterConfig, obj, file, "")
    _check_instances(cfg, file)
    _check_limits(cfg, file)
    return cfg


def load_config(path: str | Path) -> ClusterConfig:
    """Read and validate a cluster config file: ``load_config("cluster.json")``."""
    file = str(path)
    return parse_config(parse_json(read_text(file, "JSON file"), file), file)


def config_to_dict(cfg: Any) -> Any:
    """The JSON form of a config (what ``parse_config`` reads back)."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple):
        return [config_to_dict(v) for v in cfg]
    if isinstance(cfg, Role):
        return cfg.name.lower()
    if isinstance(cfg, enum.Enum):
        return cfg.value
    return cfg
