"""Workloads: deterministic request lists for the PDD testbed.

A workload is a tuple of Requests (id, arrival_s, prompt token IDs,
output_len, session, designed hit rate) plus the spec it came from and
statistics measured by replaying the prompts through an unbounded
16-token block prefix cache, as the prefill role's radix cache sees them.

Modules: spec (YAML -> WorkloadSpec), lengths / arrivals / hitrate (the
distributions), synthetic (session generator), mooncake (JSONL traces),
tokens (token IDs), cachesim (measured hit rates), records (WorkloadRequest,
Workload, statistics).

Example::

    spec = parse_workload(Fields(load_yaml("w.yaml"), "w.yaml", ""))
    wl = build_workload(spec, base_dir="scenarios")
    wl.stats.hit_rate_token_weighted, wl.stats.count
    wl = load_workload("w.yaml")            # the same, in one call
"""

from __future__ import annotations

from pathlib import Path

from testbed.reader import Fields, load_yaml
from testbed.workload.hitrate import pdd_bins
from testbed.workload.mooncake import load_mooncake
from testbed.workload.records import WorkloadRequest, Workload, WorkloadStats, summarize
from testbed.workload.spec import WorkloadKind, WorkloadSpec, parse_workload
from testbed.workload.synthetic import generate_synthetic

__all__ = ["WorkloadRequest", "Workload", "WorkloadKind", "WorkloadSpec", "WorkloadStats",
           "build_workload", "load_workload", "parse_workload"]


def build_workload(spec: WorkloadSpec, base_dir: str | Path = ".") -> Workload:
    """Generate or load the requests and measure them.

    ``base_dir`` resolves a relative trace path (the scenario file's folder).
    The hit-rate histogram uses the spec's bins for synthetic workloads and
    the 7 PDD bins for traces. Example: ``build_workload(spec).stats.count``.
    """
    if spec.kind is WorkloadKind.SYNTHETIC:
        requests = generate_synthetic(spec.synthetic)
        bins = spec.synthetic.hit_rate.bins
    else:
        requests = load_mooncake(spec, base_dir)
        bins = pdd_bins()
    warmup = tuple(r for r in requests if r.warmup)
    requests = tuple(r for r in requests if not r.warmup)
    stats, measured = summarize(requests, bins, preload=warmup)
    return Workload(requests, spec, stats, measured, warmup)


def load_workload(path: str | Path) -> Workload:
    """Read a workload YAML file (a ``{kind: ...}`` mapping) and build it.

    Example: ``load_workload("workloads/agent.yaml").stats.hit_rate_mean``.
    """
    spec = parse_workload(Fields(load_yaml(path), str(path), ""))
    return build_workload(spec, Path(path).parent)
