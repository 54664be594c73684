"""Scenario specs: topology + overrides, modes, workload, faults, expectations.

Owns Scenario and ``load_scenario``. A scenario names its topology (path
relative to the scenario file), may override the WAN link, lists the modes
to compare on identical workload and fault timeline, and states the
expectations that say what it demonstrates. Pure: reading files only.

Example::

    sc = load_scenario("scenarios/quickstart.yaml")
    [m.name for m in sc.modes]   # ["pdd", "cross-dc-pd"]
    sc.topology.wan.rtt_ms
"""

from __future__ import annotations

import dataclasses

import re
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import SpecError
from testbed.spec.faults import FaultSpec, parse_faults
from testbed.spec.link import parse_link
from testbed.reader import Fields, is_file, load_yaml
from testbed.spec.topology import Topology, load_topology
from testbed.workload import parse_workload
from testbed.workload.spec import MODEL_CONTEXT_TOKENS
from testbed.catalog import BOUNDABLE, PAIRED
from testbed.types import (ENGINES, POLICIES, SCENARIO_SLA, HandoffMode, Mode, PddSettings, Sla,
                           is_file_policy)


# The summary.json metrics an expectation may bound: the catalogue's (testbed/catalog.py)
METRICS = BOUNDABLE
# A (mode, baseline) pair's metrics over the same requests; only a comparison bounds them.
PAIRED_METRICS = PAIRED
OPS = ("==", "<=", "<", ">=", ">")
JUDGED_ON = ("median", "interval")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class Expectation:
    name: str
    metric: str
    mode: str
    op: str | None = None
    value: float | None = None
    baseline: str | None = None
    max_ratio: float | None = None
    min_ratio: float | None = None
    # over several seeds (``testbed run --seeds N``): judged on the values' median (None:
    # the default) or on the conservative end of their 95% interval ("interval")
    judged_on: str | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class ModeRun:
    """One mode as the scenario runs it: a name (its run folder), the mode,
    and the role settings and workload for it (a variant may override)."""

    name: str
    mode: Mode
    pdd: PddSettings
    workload: object            # testbed.workload.WorkloadSpec
    # the router's policy: "" (the mode's own), a built-in (types.POLICIES) or
    # `path.py:Name` (relative to the scenario file), and its parameters
    policy: str = ""
    params: dict = field(default_factory=dict, compare=False)

    @property
    def value(self) -> str:     # reads like Mode.value where a name is shown
        return self.name


FIDELITY_POLICIES = ("report", "strict")
# "emulated": roles as processes in the emulated network, on the machine's clock (the
# reference); "virtual": the same role code in one process on a simulated clock, over a
# network model (testbed/scenario/virtual.py)
CLOCKS = ("emulated", "virtual")


@dataclass(frozen=True)
class Scenario:
    name: str
    file: str
    description: str
    topology: Topology
    modes: tuple[ModeRun, ...]
    workload: object            # testbed.workload.WorkloadSpec (the shared one)
    faults: tuple[FaultSpec, ...]
    expectations: tuple[Expectation, ...]
    pdd: PddSettings = PddSettings()
    sla: Sla = SCENARIO_SLA
    seed: int = 1
    scale: float | None = None  # None: automatic
    backend: str = "auto"
    drain_s: float = 60.0       # wait after the last arrival before failing what is left
    # "strict": a run whose fidelity verdict is degraded exits 2 (testbed/report/fidelity.py);
    # "report": the verdict is reported beside the result only
    fidelity: str = "report"
    clock: str = "emulated"
    extra: dict = field(default_factory=dict, compare=False)

    def overridden(self, seed: int | None = None, scale: float | None = None,
                   backend: str | None = None) -> tuple[int, float | None, str]:
        """The (seed, scale, backend) a run of this scenario uses: each value given (a
        command-line option; None: not given) over the scenario's, so ``--seed 0`` is 0.
        The one resolution ``run``, ``run --dry-run`` and ``serve`` share."""
        return (self.seed if seed is None else seed, self.scale if scale is None else scale,
                self.backend if backend is None else backend)


def _parse_pdd(f: Fields | None, d: PddSettings = PddSettings()) -> PddSettings:
    if f is None:
        return d
    s = PddSettings(
        kv_bytes_per_token=f.int("kv_bytes_per_token", d.kv_bytes_per_token, lo=1),
        token_scale=f.int("token_scale", d.token_scale, lo=1),
        handoff_mode=HandoffMode(f.choice("handoff_mode", tuple(m.value for m in HandoffMode),
                                          d.handoff_mode.value)),
        catchup_threshold_tokens=f.int("catchup_threshold_tokens", d.catchup_threshold_tokens,
                                       lo=1),
        anomalous_filter=f.bool("anomalous_filter", d.anomalous_filter),
        late_kv_local=f.bool("late_kv_local", d.late_kv_local),
        anomalous_min_input_tokens=f.int("anomalous_min_input_tokens",
                                         d.anomalous_min_input_tokens, lo=1),
        anomalous_max_output_tokens=f.int("anomalous_max_output_tokens",
                                          d.anomalous_max_output_tokens, lo=1),
        relay_threshold_s=f.num("relay_threshold_s", d.relay_threshold_s, lo=0, unit="s"),
        relay_margin_quantile=f.num("relay_margin_quantile", d.relay_margin_quantile, lo=0,
                                    hi=1),
        time_scale=f.num("time_scale", d.time_scale, lo=0, lo_open=True),
        request_timeout_s=f.num("request_timeout_s", d.request_timeout_s, lo=0, lo_open=True,
                                unit="s"),
        drc=f.bool("drc", d.drc),
        engine=f.choice("engine", ENGINES, d.engine))
    f.done()
    return s


def _parse_expectation(f: Fields, modes: tuple[str, ...]) -> Expectation:
    name = f.str("name")
    is_ratio = f.has("baseline")
    metric = f.choice("metric", METRICS + PAIRED_METRICS if is_ratio else METRICS)
    mode = f.choice("mode", modes)
    if is_ratio:
        base = f.choice("baseline", tuple(m for m in modes if m != mode))
        mx = f.num("max_ratio", None, lo=0)
        mn = f.num("min_ratio", None, lo=0)
        if mx is None and mn is None:
            raise f.error("max_ratio", "max_ratio or min_ratio for a comparison", None)
        e = Expectation(name, metric, mode, baseline=base, max_ratio=mx, min_ratio=mn)
    else:
        e = Expectation(name, metric, mode, op=f.choice("op", OPS), value=f.num("value"))
    if f.has("judged_on"):
        e = dataclasses.replace(e, judged_on=f.choice("judged_on", JUDGED_ON))
    f.done()
    return e


def _parse_topology(f: Fields, base: Path) -> Topology:
    rel = f.str("topology")
    path = base / rel if not Path(rel).is_absolute() else Path(rel)
    if not is_file(path):
        raise f.error("topology", "an existing topology file", f"{rel} (looked at {path})")
    topo = load_topology(path)
    wan = f.sub("wan", None)
    if wan is not None:
        # Only the fields the override names change, in each direction: the
        # others keep their own values, so an asymmetric link (``reverse:``)
        # stays asymmetric.
        given = [k for k in _WAN_FIELDS if wan.has(k)]
        given += ["loss"] if wan.has("loss_pct") and "loss" not in given else []
        link = parse_link(wan, topo.wan.a_to_b)
        try:
            topo = topo.with_wan(**{k: getattr(link, k) for k in given})
        except SpecError as e:  # valid for one direction, not for the other
            raise wan.error(e.path, f"{e.expected} (in both WAN directions)", e.got) from None
    return topo


_WAN_FIELDS = ("rate_gbit", "delay_ms", "jitter_ms", "jitter_distribution", "loss", "reorder_pct",
               "queue_limit_pkts", "duplicate_pct")


def parse_scenario(data: object, file: str) -> Scenario:

    base = Path(file).parent
    f = Fields(data, file, "")
    name = f.str("name")
    description = f.str("description", "")
    topo = _parse_topology(f, base)
    pdd = _parse_pdd(f.sub("pdd", None))
    workload_raw = f.raw("workload")
    workload = parse_workload(f.sub("workload"))
    _check_context(file, "workload", workload)
    modes = _parse_modes(f, pdd, workload_raw, workload)
    modes_raw = tuple(m.name for m in modes)
    faults = parse_faults(f, "faults", base)
    exps = tuple(_parse_expectation(e, tuple(modes_raw)) for e in f.items("expectations")) \
        if f.has("expectations") else ()
    scale = f.raw("scale", "auto")
    if scale != "auto":
        scale = f.num("scale", lo=1)
    sc = Scenario(
        name, file, description, topo, modes, workload, faults, exps,
        pdd=pdd,
        sla=_parse_sla(f.sub("sla", None)),
        seed=f.int("seed", 1, lo=0),
        scale=None if scale == "auto" else scale,
        backend=f.choice("backend", ("auto", "netem", "userspace"), "auto"),
        drain_s=f.num("drain_s", 60.0, lo=0, unit="s"),
        fidelity=f.choice("fidelity", FIDELITY_POLICIES, "report"),
        clock=f.choice("clock", CLOCKS, "emulated"))
    f.done()
    return sc


def _check_context(file: str, where: str, workload: object) -> None:
    """Longest prompt + longest output of a synthetic workload within the model's context."""
    syn = getattr(workload, "synthetic", None)
    if syn is None:
        return
    lengths = [("input_len", syn.input_len, syn.output_len)]
    if syn.anomalous is not None:
        lengths.append(("anomalous.input_len", syn.anomalous.input_len,
                        syn.anomalous.output_len))
    for name, prompt, output in lengths:
        if prompt.max_tokens + output.max_tokens > MODEL_CONTEXT_TOKENS:
            raise SpecError(file, f"{where}.{name}",
                            f"prompts that leave room for the outputs in the run model's "
                            f"context of {MODEL_CONTEXT_TOKENS} tokens (max_tokens <= "
                            f"{MODEL_CONTEXT_TOKENS - output.max_tokens} with outputs of up "
                            f"to {output.max_tokens})", prompt.max_tokens)


def _merge(base: object, over: object) -> object:
    """YAML-level override: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base.get(k), v)
        return out
    return over


def _parse_modes(f: Fields, pdd: PddSettings, workload_raw: object,
                 workload: object) -> tuple[ModeRun, ...]:
    """``modes``: names of modes or built-in policies, or variants {name, mode, policy,
    params, pdd: {...}, workload: {...}}. A policy that is not a mode runs in mode pdd
    (every role, the router's models) unless ``mode`` says otherwise; whether a policy
    file loads and takes its params is checked by ``testbed.scenario.policies``."""

    mode_vals = tuple(m.value for m in Mode)
    out: list[ModeRun] = []
    for i, item in enumerate(f.list("modes", min_len=1)):
        where = f"{f.where('modes')}[{i}]"
        if isinstance(item, str):
            if item not in POLICIES:
                raise SpecError(f.file, where, "one of " + ", ".join(POLICIES) + " (or a "
                                "mapping with name and mode or policy)", item)
            mode = Mode(item) if item in mode_vals else Mode.PDD
            run = ModeRun(item, mode, pdd, workload, "" if item in mode_vals else item)
        else:
            v = Fields(item, f.file, f"modes[{i}]")
            name = v.str("name", check=lambda s: None if NAME_RE.match(s)
                         else "a folder-safe name of letters, digits and dashes")
            policy = _resolve_policy(v.str("policy", "", check=_policy_problem), f.file)
            if policy and not v.has("mode"):
                mode = Mode(policy) if policy in mode_vals else Mode.PDD
            else:
                mode = Mode(v.choice("mode", mode_vals))
            params = v.raw("params", {})
            if not isinstance(params, dict):
                raise SpecError(f.file, f"modes[{i}].params", "a mapping of parameter names "
                                "to values", params)
            if params and not policy:
                raise SpecError(f.file, f"modes[{i}].params", "params only with a policy",
                                params)
            mpdd = _parse_pdd(v.sub("pdd", None), pdd)
            wl = workload
            if v.has("workload"):
                merged = _merge(workload_raw, v.raw("workload"))
                wl = parse_workload(Fields(merged, f.file, f"modes[{i}].workload"))
                _check_context(f.file, f"modes[{i}].workload", wl)
            v.done()
            run = ModeRun(name, mode, mpdd, wl, policy, dict(params))
        if run.name in [m.name for m in out]:
            raise SpecError(f.file, where, "a mode name not listed before", run.name)
        out.append(run)
    return tuple(out)


def _resolve_policy(spec: str, file: str) -> str:
    """A file policy's path made absolute (relative to the scenario file), so the role
    processes find it from any working directory; a built-in name as it is."""
    path, _, name = spec.rpartition(":")
    if not is_file_policy(spec) or Path(path).is_absolute():
        return spec
    return f"{Path(file).resolve().parent / path}:{name}"


def _policy_problem(spec: str) -> str | None:
    """None if ``spec`` names a built-in policy or has the form path.py:Name."""
    if spec in POLICIES or is_file_policy(spec):
        return None
    return "a built-in policy (" + ", ".join(POLICIES) + ") or path/to/file.py:Name"


def _parse_sla(f: Fields | None) -> Sla:
    if f is None:
        return SCENARIO_SLA
    s = Sla(f.num("ttft_s", SCENARIO_SLA.ttft_s, lo=0, lo_open=True, unit="s"),
            f.num("tpot_ms", SCENARIO_SLA.tpot_ms, lo=0, lo_open=True, unit="ms"))
    f.done()
    return s


def with_engine(sc: Scenario, engine: str) -> Scenario:
    """``sc`` with every mode's roles (and verify) on ``engine`` (torch | hash): the
    command line's ``--engine``, which compares engines on one scenario file."""
    from dataclasses import replace

    if engine not in ENGINES:
        raise SpecError(sc.file, "engine", " | ".join(ENGINES), engine)
    return replace(sc, pdd=replace(sc.pdd, engine=engine),
                   modes=tuple(replace(m, pdd=replace(m.pdd, engine=engine)) for m in sc.modes))


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raises SpecError on any problem."""
    return parse_scenario(load_yaml(path), str(path))


def with_seed(sc: Scenario, seed: int) -> Scenario:
    """``sc`` drawn from ``seed``: the run's (the network's random draws) and every
    workload's (a synthetic workload's requests and arrivals; a trace's sampling where it
    samples), so a second seed is a second sample of the same scenario (``testbed
    spread``)."""
    from dataclasses import replace

    def reseeded(w):
        if getattr(w, "synthetic", None) is not None:
            return replace(w, synthetic=replace(w.synthetic, seed=seed))
        if getattr(w, "mooncake", None) is not None:
            return replace(w, mooncake=replace(w.mooncake, seed=seed))
        return w

    return replace(sc, seed=seed, workload=reseeded(sc.workload),
                   modes=tuple(replace(m, workload=reseeded(m.workload)) for m in sc.modes))
