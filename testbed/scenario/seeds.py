"""One scenario on N seeds: the runs, their table with intervals, and the suite's view.

Owns ``run_seeds`` (seeds S..S+N-1, S the options' seed or the scenario's, each
into OUT/seed-K with ``with_seed``; then OUT/seeds.json and OUT/seeds.md from
testbed/report/seeds.py) and ``seeds_run`` (a suite run function that does the
same and returns the seeds as one summary: ``testbed suite --seeds N``).
``testbed run --seeds N`` and ``testbed suite --seeds N`` both run through here.

Example::

    runs, table = run_seeds(sc, RunOptions(out_dir=Path("runs/s")), 5, run_scenario)
    table["expectations"]["pdd cuts the TTFT tail"]["ci95"]
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Callable

from testbed.report.seeds import seeds_markdown, seeds_summary, seeds_table
from testbed.scenario.runner import RunOptions
from testbed.spec.scenario import Scenario, with_seed

RunFn = Callable[[Scenario, RunOptions], dict]


def run_seeds(sc: Scenario, opts: RunOptions, n: int, run: RunFn) -> tuple[list, dict]:
    """Run ``sc`` on ``n`` seeds with ``run``; write OUT/seeds.json and OUT/seeds.md;
    return the (label, summary) pairs and the table."""
    if n < 1:
        raise ValueError(f"seeds: need at least 1, got {n}")
    seed0 = sc.seed if opts.seed is None else opts.seed
    runs = []
    for seed in range(seed0, seed0 + n):
        o = replace(opts, out_dir=opts.out_dir / f"seed-{seed}", seed=seed)
        runs.append((f"seed {seed}", run(with_seed(sc, seed), o)))
    table = seeds_table(runs, judged_on={e.name: e.judged_on or "median"
                                         for e in sc.expectations})
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    (opts.out_dir / "seeds.json").write_text(
        json.dumps({"scenario": sc.name, **table}, indent=1) + "\n")
    (opts.out_dir / "seeds.md").write_text(seeds_markdown(sc.name, table))
    return runs, table


def seeds_run(n: int, run: RunFn) -> RunFn:
    """A suite run function: ``sc`` on ``n`` seeds (``run_seeds``), as one summary
    (testbed/report/seeds.py ``seeds_summary``) that the suite judges like a run's."""
    def go(sc: Scenario, opts: RunOptions) -> dict:
        return seeds_summary(*run_seeds(sc, opts, n, run))
    return go
