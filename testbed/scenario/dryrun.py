"""``testbed run --dry-run``: what would run, without building anything.

Owns the plain-text description of a scenario: topology and WAN, backend
(probed when root, else assumed userspace), k, the network plan's size,
the workload's measured statistics, the fault timeline in time order and
the expectations. Needs no root.
"""

from __future__ import annotations

import os
from pathlib import Path

from testbed.net.build import make_plan
from testbed.net.shaping import Backend


def _backend(name: str | None) -> tuple[Backend, str]:
    if name and name != "auto":
        return Backend(name), "given"
    if os.geteuid() == 0:
        from testbed.net.backend import probe_backend

        return probe_backend()[0], "probed"
    return Backend.USERSPACE, "assumed (not root: no probe)"


def describe(sc, opts) -> str:
    from testbed.workload import build_workload
    from testbed.workload.spec import MODEL_CONTEXT_TOKENS

    seed, scale, backend_name = sc.overridden(opts.seed, opts.scale, opts.backend)
    backend, how = _backend(backend_name)
    plan = make_plan(sc.topology, backend, scale, seed, prefix="tb0000")
    wl = build_workload(sc.workload, Path(sc.file).parent)
    st = wl.stats
    wan = sc.topology.wan
    lines = [
        f"scenario   {sc.name} ({sc.file})",
        f"topology   {sc.topology.name}: {len(sc.topology.hosts)} hosts; WAN "
        f"{wan.a_to_b.rate_gbit:g} Gbit/s nominal, RTT {wan.rtt_ms:g} ms, jitter "
        f"{wan.a_to_b.jitter_ms:g} ms, loss {wan.a_to_b.loss.mean_pct:g}%",
        f"backend    {backend.value} ({how}); k={plan.scale:g}: WAN emulated at "
        f"{plan.channel('wan/a>b').htb.emulated_gbit:g} Gbit/s; {len(plan.steps)} plan steps",
        f"modes      {', '.join(m.value for m in sc.modes)} (each on a fresh network)",
        f"engine     {', '.join(sorted({m.pdd.engine for m in sc.modes}))} (the roles' compute)",
        f"workload   {st.count} requests over {st.span_s:.1f} s; input mean "
        f"{st.input_len.mean:.0f} tokens, output mean {st.output_len.mean:.0f}; hit rate "
        f"{st.hit_rate_token_weighted * 100:.1f}% token-weighted, "
        f"{st.hit_rate_mean * 100:.1f}% per request",
    ]
    over = [r.id for r in wl.requests if r.input_len + r.output_len > MODEL_CONTEXT_TOKENS]
    if over:
        lines.append(f"           {len(over)} requests (ids {', '.join(map(str, over[:5]))}"
                     f"{', ...' if len(over) > 5 else ''}) exceed the run model's context of "
                     f"{MODEL_CONTEXT_TOKENS} tokens: the roles will reject them (a trace's "
                     f"over_context: skip leaves them out)")
    lines.append("faults" + ("     none" if not sc.faults else ""))
    for f in sorted(sc.faults, key=lambda f: (f.trigger is not None, f.at_s)):
        end = f" for {f.duration_s:g} s" if f.duration_s else ""
        params = ", ".join(f"{k}={v}" for k, v in f.params.items())
        when = f"t={f.at_s:>6.1f}s" if f.trigger is None else f.trigger.describe() + ":"
        lines.append(f"  {when} {f.kind} on {f.link}{end} {params}")
    lines.append("expect" + ("     none" if not sc.expectations else ""))
    for e in sc.expectations:
        bound = f"{e.op} {e.value:g}" if e.op else \
            f"<= {e.max_ratio:g} x {e.baseline}" if e.max_ratio is not None \
            else f">= {e.min_ratio:g} x {e.baseline}"
        lines.append(f"  {e.name}: {e.mode}.{e.metric} {bound}")
    return "\n".join(lines)
