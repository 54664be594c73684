"""Workload specs: a synthetic session generator or a Mooncake trace, from YAML.

Owns WorkloadKind, SessionSpec, AnomalySpec, SyntheticSpec, MooncakeSpec,
WorkloadSpec and ``parse_workload``. Parsing is pure (no file is opened; a
trace's existence is checked when the workload is built) and strict: units
are in the field names, unknown keys are rejected, and every error is a
SpecError naming the file, the YAML path, what was expected and what was got.
The spec remembers its file and YAML path so that build-time errors (a
missing trace) can point back at the field.

Synthetic example::

    kind: synthetic
    seed: 7
    n_requests: 500              # or duration_s: 120
    arrival: {process: poisson, rate_rps: 4}
    input_len: {dist: uniform, min_tokens: 1024, max_tokens: 4096}
    output_len: {dist: lognormal, median_tokens: 128, sigma: 0.5, max_tokens: 1024}
    hit_rate: {mean_pct: 90}
    sessions: {concurrent: 16, turns: 8, shared_prefixes: 4}
    anomalous: {share_pct: 3.5, input_len: {dist: fixed, tokens: 8192}}

Mooncake example::

    kind: mooncake
    path: /work/shared/traces/mooncake/conversation_trace.jsonl
    max_requests: 2000
    input_len_divisor: 32        # 512-token hash blocks become 16-token blocks
    output_len_divisor: 32
    time_scale: 1.0
    over_context: keep           # a request the run model cannot hold: keep it (the roles
                                 # reject it, a failed request with the reason) or skip it

Example::

    spec = parse_workload(Fields(load_yaml("w.yaml"), "w.yaml", ""))
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from testbed.reader import Fields, join
from testbed.workload.arrivals import ArrivalSpec, parse_arrival
from testbed.workload.hitrate import HitRateSpec, parse_hit_rate
from testbed.workload.lengths import MAX_TOKENS, LengthDist, parse_length_dist
from testbed.workload.tokens import MAX_BLOCK_TOKENS

MAX_REQUESTS = 1_000_000
# The run model's longest sequence (testbed/pdd/compute/engine.py, ModelConfig.max_context).
# A synthetic workload whose prompt plus output can exceed it is refused when the scenario
# is loaded (its length bounds are the spec's); a trace is data: a request of it beyond the
# context is kept (the roles reject it: a failed request with the reason; the dry run
# counts them) or, with ``over_context: skip``, left out when the workload is built.
MODEL_CONTEXT_TOKENS = 4096
OVER_CONTEXT = ("keep", "skip")
MAX_DURATION_S = 7 * 86_400.0
ANOMALOUS_MAX_OUTPUT_TOKENS = 500  # PDD: anomalous requests emit fewer than 500 tokens
DEFAULT_ANOMALOUS_OUTPUT = LengthDist.uniform(1, ANOMALOUS_MAX_OUTPUT_TOKENS - 1)


class WorkloadKind(enum.Enum):
    SYNTHETIC = "synthetic"
    MOONCAKE = "mooncake"


@dataclass(frozen=True)
class SessionSpec:
    concurrent: int = 16  # sessions open at once; each request goes to one at random
    turns: int = 8  # requests per session before it is replaced by a new one
    shared_prefixes: int = 4  # system prompts shared by sessions (session id mod count)
    # True: each shared system prompt is sent once before the measured requests (a
    # warm-up, not measured), as a long-running deployment already holds them; False:
    # the first use of each is a cold, measured request
    warmup: bool = False


@dataclass(frozen=True)
class AnomalySpec:
    share_pct: float  # share of requests replaced by anomalous ones
    input_len: LengthDist  # very long, fresh prompts (nothing shared)
    output_len: LengthDist = DEFAULT_ANOMALOUS_OUTPUT  # always < 500 tokens


@dataclass(frozen=True)
class SyntheticSpec:
    seed: int
    n_requests: int | None  # exactly one of n_requests, duration_s
    duration_s: float | None
    arrival: ArrivalSpec
    input_len: LengthDist
    output_len: LengthDist
    hit_rate: HitRateSpec
    sessions: SessionSpec = SessionSpec()
    anomalous: AnomalySpec | None = None


@dataclass(frozen=True)
class MooncakeSpec:
    path: str  # JSONL trace; relative paths are resolved against the workload's base dir
    time_scale: float = 1.0  # arrival_s = (timestamp_ms / 1000 - start_s) * time_scale
    start_s: float = 0.0  # skip requests before this trace time
    duration_s: float | None = None  # keep trace times in [start_s, start_s + duration_s]
    sample_every: int = 1  # keep every n-th request (after the time window)
    sample_pct: float = 100.0  # then keep each with this probability (seeded)
    seed: int = 0
    max_requests: int | None = None  # stop after this many kept requests
    block_tokens: int = 512  # tokens per hash id in the trace
    input_len_divisor: int = 1  # prompt lengths and hash blocks / this (<= block_tokens / 16)
    output_len_divisor: int = 1
    missing_ok: bool = False  # absent file -> empty workload instead of an error
    over_context: str = "keep"  # a request over MODEL_CONTEXT_TOKENS: keep | skip it

    @property
    def scaled_block_tokens(self) -> int:
        return self.block_tokens // self.input_len_divisor


@dataclass(frozen=True)
class WorkloadSpec:
    kind: WorkloadKind
    file: str  # the YAML file, for errors raised when building
    where: str  # YAML path of the workload mapping ('' at top level)
    synthetic: SyntheticSpec | None = None
    mooncake: MooncakeSpec | None = None


def _parse_sessions(f: Fields | None) -> SessionSpec:
    if f is None:
        return SessionSpec()
    d = SessionSpec()
    spec = SessionSpec(concurrent=f.int("concurrent", d.concurrent, lo=1, hi=100_000),
                       turns=f.int("turns", d.turns, lo=1, hi=MAX_REQUESTS),
                       shared_prefixes=f.int("shared_prefixes", d.shared_prefixes, lo=1, hi=1024),
                       warmup=f.bool("warmup", d.warmup))
    f.done()
    return spec


def _parse_anomalous(f: Fields) -> AnomalySpec:
    share = f.num("share_pct", lo=0, hi=100, unit="%")
    input_len = parse_length_dist(f.sub("input_len"))
    output_len = DEFAULT_ANOMALOUS_OUTPUT
    if f.has("output_len"):
        output_len = parse_length_dist(f.sub("output_len"))
        if output_len.max_tokens >= ANOMALOUS_MAX_OUTPUT_TOKENS:
            raise f.error("output_len", f"a distribution below {ANOMALOUS_MAX_OUTPUT_TOKENS} "
                          "output tokens (max_tokens)", output_len.max_tokens)
    f.done()
    return AnomalySpec(share, input_len, output_len)


def _parse_synthetic(f: Fields) -> SyntheticSpec:
    if f.has("n_requests") == f.has("duration_s"):
        raise f.error("n_requests", "exactly one of n_requests and duration_s",
                      "both" if f.has("n_requests") else "neither")
    n = f.int("n_requests", None, lo=1, hi=MAX_REQUESTS)
    duration = f.num("duration_s", None, lo=0, lo_open=True, hi=MAX_DURATION_S, unit="s")
    seed = f.int("seed", 0, lo=0, hi=2**63 - 1)
    arrival = parse_arrival(f.sub("arrival"))
    if duration is not None and duration * arrival.mean_rate_rps > MAX_REQUESTS:
        raise f.error("duration_s", f"a duration giving at most {MAX_REQUESTS} requests at "
                      f"{arrival.mean_rate_rps:g} requests/s", duration)
    spec = SyntheticSpec(
        seed=seed, n_requests=n, duration_s=duration, arrival=arrival,
        input_len=parse_length_dist(f.sub("input_len")),
        output_len=parse_length_dist(f.sub("output_len")),
        hit_rate=parse_hit_rate(f.sub("hit_rate")),
        sessions=_parse_sessions(f.sub("sessions", None)),
        anomalous=_parse_anomalous(f.sub("anomalous")) if f.has("anomalous") else None)
    return spec


def _parse_mooncake(f: Fields) -> MooncakeSpec:
    block = f.int("block_tokens", 512, lo=1, hi=MAX_BLOCK_TOKENS)
    in_div = f.int("input_len_divisor", 1, lo=1, hi=MAX_TOKENS)
    if block % in_div:
        raise f.error("input_len_divisor", f"a divisor of block_tokens ({block}) so that "
                      "hash blocks keep a whole number of tokens", in_div)
    if f.has("sample_every") and f.has("sample_pct"):
        raise f.error("sample_pct", "only one of sample_every and sample_pct", "both")
    return MooncakeSpec(
        path=f.str("path"),
        time_scale=f.num("time_scale", 1.0, lo=0, lo_open=True, hi=1e6),
        start_s=f.num("start_s", 0.0, lo=0, hi=MAX_DURATION_S, unit="s"),
        duration_s=f.num("duration_s", None, lo=0, lo_open=True, hi=MAX_DURATION_S, unit="s"),
        sample_every=f.int("sample_every", 1, lo=1, hi=MAX_REQUESTS),
        sample_pct=f.num("sample_pct", 100.0, lo=0, lo_open=True, hi=100, unit="%"),
        seed=f.int("seed", 0, lo=0, hi=2**63 - 1),
        max_requests=f.int("max_requests", None, lo=1, hi=MAX_REQUESTS),
        block_tokens=block,
        input_len_divisor=in_div,
        output_len_divisor=f.int("output_len_divisor", 1, lo=1, hi=MAX_TOKENS),
        missing_ok=f.bool("missing_ok", False),
        over_context=f.choice("over_context", OVER_CONTEXT, "keep"))


def parse_workload(f: Fields) -> WorkloadSpec:
    """Parse a ``{kind: synthetic | mooncake, ...}`` mapping; raises SpecError.

    Example: ``parse_workload(Fields(data["workload"], "s.yaml", "workload"))``.
    """
    kind = WorkloadKind(f.choice("kind", tuple(k.value for k in WorkloadKind)))
    if kind is WorkloadKind.SYNTHETIC:
        spec = WorkloadSpec(kind, f.file, f.path, synthetic=_parse_synthetic(f))
    else:
        spec = WorkloadSpec(kind, f.file, f.path, mooncake=_parse_mooncake(f))
    f.done()
    return spec


def error_path(spec: WorkloadSpec, key: str) -> str:
    """YAML path of a field of the workload mapping, for build-time errors."""
    return join(spec.where, key)
