"""``testbed crossval``: every scenario on both clocks, and the virtual one's error.

Owns ``run_crossval`` and ``find_runs``. For each scenario: the virtual
clock runs it ``virtual_runs`` times, on tie seeds 0, 1, ... (a virtual
run repeats exactly; its tie seed decides the order of simultaneous events,
as a real machine's noise does; a scenario it cannot model is listed as
refused, with the reason), and the
emulator's reference is several runs on the scenario's seed: made here
(``emulated_runs`` of them, root; NAME/emulated-N) or found among run directories made
before (``find_runs``: every run directory under the given folders whose
metadata names the scenario and its seed and was emulated). Then
``testbed.report.crossval`` tabulates: OUT/crossval.json, OUT/crossval.md.

Example::

    sudo testbed crossval scenarios/ --emulated-runs 3 --out runs/xval
    testbed crossval scenarios/quickstart.yaml --emulated-from runs/suite runs/spread-qs \
        --out runs/xval
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from testbed.scenario.metadata import plain
from testbed.scenario.virtual import unsupported


# what a run ran, as metadata.json's "resolved" records it: a run whose sections differ
# from the scenario's (a workload of 120 requests where the file now asks 240) is another
# experiment, not a reference for this one
RAN = ("topology", "modes", "faults", "workload", "pdd", "drain_s")


def ran(resolved: dict) -> dict:
    """The sections of a resolved scenario that decide what runs (``RAN``), without the
    paths of the files they came from (a clone elsewhere runs the same)."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("file", "where")}
        return [strip(v) for v in x] if isinstance(x, list) else x
    return strip(json.loads(json.dumps({k: resolved.get(k) for k in RAN}, sort_keys=True,
                                       default=str)))


def find_runs(roots: Sequence[Path], scenario: str, seed: int,
              sc=None) -> list[Path]:
    """Emulated run directories (summary.json and metadata.json, not a virtual run) of
    ``scenario`` on ``seed`` under ``roots`` (each root itself or up to two levels down);
    with ``sc`` (the loaded scenario) only those that ran what it runs (``ran``), each
    other one named on stderr with the section that differs."""
    want = ran(json.loads(json.dumps(plain(sc), default=str))) if sc is not None else None
    found = []
    for root in roots:
        candidates = [root] + sorted(root.glob("*")) + sorted(root.glob("*/*"))
        for d in candidates:
            meta_path, summary = d / "metadata.json", d / "summary.json"
            if not (meta_path.is_file() and summary.is_file()):
                continue
            try:
                meta = json.loads(meta_path.read_text())
            except ValueError:
                continue
            if meta.get("scenario") == scenario and meta.get("seed") == seed \
                    and meta.get("clock", "emulated") != "virtual" and d not in found:
                if want is not None:
                    have = ran(meta.get("resolved") or {})
                    differ = [k for k in RAN if k != "modes" and have[k] != want[k]]
                    if any(m not in (have["modes"] or []) for m in want["modes"] or []):
                        differ.append("modes")  # a run of more modes serves the shared ones
                    if differ:
                        print(f"crossval: {d}: not a run of this {scenario}.yaml "
                              f"(it differs in: {', '.join(differ)}): left out", file=sys.stderr)
                        continue
                found.append(d)
    return found


def _revision(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / "metadata.json").read_text()).get("git_revision"))[:12]
    except (OSError, ValueError):
        return "?"


def run_crossval(paths: Sequence[str], out: Path, opts, emulated_runs: int = 0,
                 emulated_from: Sequence[Path] = (), virtual_runs: int = 3) -> dict:
    """See the module docstring; ``opts`` is the runner's RunOptions (its out_dir and
    clock are set per run)."""
    from testbed.report.crossval import crossval, crossval_markdown
    from testbed.scenario.runner import run_scenario
    from testbed.scenario.suite import collect_paths, load_all

    pairs, refused, missing, sources = {}, {}, [], {}
    for sc in load_all(collect_paths(list(paths))):
        if problems := unsupported(sc):
            refused[sc.name] = "; ".join(problems)
            continue
        seed = sc.seed if opts.seed is None else opts.seed
        vdirs = [out / sc.name / f"virtual-tie{i}" for i in range(virtual_runs)]
        for i, vdir in enumerate(vdirs):
            if not (vdir / "summary.json").is_file():
                run_scenario(sc, dataclasses.replace(opts, out_dir=vdir, clock="virtual",
                                                     tie_seed=i))
        edirs = find_runs(list(emulated_from), sc.name, seed, sc)
        for i in range(1, emulated_runs + 1):
            d = out / sc.name / f"emulated-{i}"
            if not (d / "summary.json").is_file():
                run_scenario(sc, dataclasses.replace(opts, out_dir=d, clock="emulated"))
            edirs.append(d)
        if not edirs:
            missing.append(sc.name)
            continue
        pairs[sc.name] = ([json.loads((d / "summary.json").read_text()) for d in edirs],
                          [json.loads((d / "summary.json").read_text()) for d in vdirs])
        sources[sc.name] = [f"{d} (git {_revision(d)})" for d in edirs]
        print(f"crossval: {sc.name}: {len(edirs)} emulated run(s): "
              + ", ".join(str(d) for d in edirs), file=sys.stderr)
    table = crossval(pairs, refused, sources)
    table["no_emulated_runs"] = missing
    out.mkdir(parents=True, exist_ok=True)
    (out / "crossval.json").write_text(json.dumps(table, indent=1) + "\n")
    text = crossval_markdown(table)
    if missing:
        text += "\nNo emulated run found (not compared): " + ", ".join(missing) + "\n"
    (out / "crossval.md").write_text(text)
    return table
