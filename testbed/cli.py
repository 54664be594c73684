"""PDD network emulation testbed: two datacenters in network namespaces, a shaped WAN, PDD's roles.

This module is the command line: argument parsing, exit codes, the run
directory's lock (``out_dir_lock``) and ``serve``'s merging of a scenario
into a deployment; each subcommand imports what it runs inside itself, so
``testbed validate`` needs neither pyroute2 nor torch.

Exit codes: 0 success; 1 a check or expectation failed (calibrate out of
tolerance, a fuzzed reader raised something other than SpecError); 2 bad
input (SpecError), a failed emulation, or missing privileges/tools; 130
interrupted (Ctrl-C or SIGINT, also when started in the background by a
script, whose shell hands it SIGINT ignored); 143 terminated (SIGTERM/SIGHUP;
teardown ran).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
from contextlib import contextmanager

from testbed.errors import SpecError, TestbedError

DEFAULT_TOPOLOGY = "topologies/two-dc.yaml"
SOAK_SCENARIO = "scenarios/soak/mooncake-soak.yaml"
DEFAULT_IMAGE = "localhost/pdd-testbed:0.1.0"  # testbed.export.build.DEFAULT_IMAGE
DEFAULT_DC_NODE_LABEL = "pdd-testbed/datacenter"


def _backend(value: str):
    from testbed.net.shaping import Backend

    return None if value == "auto" else Backend(value)


def _load_topology(args):
    from testbed.spec.topology import load_topology

    topo = load_topology(args.topology)
    for flag, ok, bound in (("wan_rate_gbit", lambda v: 0 < v <= 1000, "in (0, 1000]"),
                            ("wan_rtt_ms", lambda v: 0 <= v <= 20_000, "in [0, 20000]"),
                            ("wan_loss_pct", lambda v: 0 <= v <= 100, "in [0, 100]")):
        value = getattr(args, flag, None)
        if value is not None and not ok(value):  # NaN fails too
            raise SpecError("command line", "--" + flag.replace("_", "-"), f"a number {bound}",
                            value)
    changes = {}
    if getattr(args, "wan_rate_gbit", None) is not None:
        changes["rate_gbit"] = args.wan_rate_gbit
    if getattr(args, "wan_rtt_ms", None) is not None:
        changes["delay_ms"] = args.wan_rtt_ms / 2  # the RTT, split evenly over both directions
    if getattr(args, "wan_loss_pct", None) is not None:
        from testbed.impairment import LossSpec
        changes["loss"] = LossSpec("random", pct=args.wan_loss_pct)
    return topo.with_wan(**changes) if changes else topo


def cmd_validate(args) -> int:
    from testbed.reader import load_yaml
    from testbed.spec.topology import parse_topology

    for path in args.files:
        data = load_yaml(path)
        if isinstance(data, dict) and "datacenters" in data:
            topo = parse_topology(data, path)
            print(f"{path}: topology {topo.name!r} ok: {len(topo.hosts)} hosts, WAN "
                  f"{topo.wan.a_to_b.rate_gbit:g}/{topo.wan.b_to_a.rate_gbit:g} Gbit/s, "
                  f"RTT {topo.wan.rtt_ms:g} ms")
        elif isinstance(data, dict) and "workload" in data:
            from testbed.spec.scenario import parse_scenario

            from testbed.scenario.policies import check_policies

            sc = parse_scenario(data, path)
            problems = check_policies(sc)
            if problems:
                for err in problems:
                    print(f"testbed: invalid input: {err}", file=sys.stderr)
                return 2
            print(f"{path}: scenario {sc.name!r} ok: modes "
                  f"{', '.join(m.value for m in sc.modes)}; {len(sc.faults)} faults, "
                  f"{len(sc.expectations)} expectations")
        else:
            got = "an empty file" if data is None else f"another document ({type(data).__name__})"
            raise SpecError(path, "", "a topology (with 'datacenters') or a scenario "
                            "(with 'workload')", got)
    return 0


def cmd_plan(args) -> int:
    from testbed.net.plan import plan_json
    from testbed.net.build import make_plan
    from testbed.net.shaping import Backend

    backend = _backend(args.backend) or Backend.USERSPACE
    plan = make_plan(_load_topology(args), backend, args.scale, prefix="tb0000")
    print(f"# backend {backend.value}, scale k={plan.scale:g}, {len(plan.steps)} steps")
    print(plan_json(plan))
    return 0


def cmd_check(args) -> int:
    from testbed.net.check import format_check, run_check

    report = run_check(args.topology, measure=not args.no_measure, backend=_backend(args.backend))
    print(json.dumps(report.as_dict(), indent=1) if args.json else format_check(report))
    return 0


def cmd_calibrate(args) -> int:
    from testbed.net.build import open_network
    from testbed.net.calibrate import (CalibrateOptions, calibrate, results_json,
                                       results_table)

    topo = _load_topology(args)
    opts = CalibrateOptions(links=tuple(args.links) if args.links else None,
                            shaper_rate=args.shaper_rate)
    with open_network(topo, _backend(args.backend), args.scale, args.seed) as net:
        results = calibrate(net, opts)
        out = results_json(net, results)
        text = json.dumps(out, indent=1) if args.json else results_table(net, results)
    print(text)
    return 0 if out["passed"] else 1


LOCK_FILE = ".testbed-lock"


@contextmanager
def out_dir_lock(out, what: str):
    """Hold an exclusive lock on the folder a command writes (``out/.testbed-lock``,
    flock: released when the process ends, however it ends), so two commands never
    write one run folder at once (two reproductions into one folder interleaved their
    links.csv rows: 2026-12-02). A second command gets a TestbedError naming the folder
    and the holder. The file stays (it holds no state once unlocked)."""
    import fcntl
    import os
    from pathlib import Path

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / LOCK_FILE, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "unknown"
        fh.close()
        raise TestbedError(f"{out}: another command is writing this folder ({holder}); wait "
                           "for it to end or pick another --out") from None
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}: {what}\n")
        fh.flush()
        yield
    finally:
        fh.close()


def _run_options(args, out, dry_run: bool = False):
    from testbed.scenario.runner import RunOptions

    return RunOptions(out, args.seed, args.scale,
                      None if args.backend == "auto" else args.backend, dry_run,
                      args.ready_timeout_s, args.preflight_tol_ms,
                      pcap=getattr(args, "pcap", False), engine=getattr(args, "engine", None),
                      clock=getattr(args, "clock", None), tie_seed=getattr(args, "tie_seed", 0))


def cmd_run(args) -> int:
    from pathlib import Path

    from testbed.scenario.runner import run_scenario
    from testbed.spec.scenario import load_scenario

    sc = load_scenario(args.scenario)
    out = Path(args.out) if args.out else Path("runs") / \
        f"{sc.name}-{__import__('time').strftime('%Y%m%d-%H%M%S')}"
    opts = _run_options(args, out, args.dry_run)
    if args.dry_run:
        from testbed.scenario.dryrun import describe
        from testbed.scenario.policies import check_policies
        from testbed.spec.scenario import with_engine

        if problems := check_policies(sc):  # run_scenario checks them too
            raise problems[0]

        print(describe(sc if opts.engine is None else with_engine(sc, opts.engine), opts))
        return 0
    if args.seeds < 1:
        print(f"testbed run: --seeds must be at least 1, got {args.seeds}", file=sys.stderr)
        return 2
    if args.seeds > 1:
        return _run_seeds(sc, args, out)
    with out_dir_lock(out, "testbed run " + args.scenario):
        summary = run_scenario(sc, opts)
    from testbed.report.summary import exit_code, summary_table

    print(summary_table(summary))
    print(f"report: {out / 'report.md'}")
    return _fidelity_exit(summary, exit_code(summary))


def _run_seeds(sc, args, out) -> int:
    """``run --seeds N``: seeds S..S+N-1 (S: --seed or the scenario's) into OUT/seed-K, then
    every metric and ratio with its 95% interval: OUT/seeds.md and .json
    (testbed/report/seeds.py). Exit 0 when every expectation holds over the seeds (on
    its median, or its interval where it says ``judged_on: interval``) and no run lost
    or duplicated a token, else 1."""
    from testbed.report.seeds import seeds_markdown
    from testbed.scenario.runner import run_scenario
    from testbed.scenario.seeds import run_seeds

    with out_dir_lock(out, "testbed run --seeds " + args.scenario):
        runs, table = run_seeds(sc, _run_options(args, out), args.seeds, run_scenario)
    print(seeds_markdown(sc.name, table) + f"seeds: {out / 'seeds.md'}")
    verdicts = [x["passed_over_seeds"] for x in table["expectations"].values()]
    tokens = all(s["modes"][m].get("tokens_lost", 0) == 0 and
                 s["modes"][m].get("tokens_duplicated", 0) == 0
                 for _, s in runs for m in s["modes"])
    return 0 if tokens and all(v is not False for v in verdicts) else 1


def _fidelity_exit(summary: dict, code: int) -> int:
    """``code``, saying on stderr why a strict scenario's degraded run exits 2."""
    if code == 2:
        print("testbed: the scenario requires a faithful emulation (fidelity: strict) and "
              "this run's was degraded: " + "; ".join(summary["fidelity"]["reasons"]),
              file=sys.stderr)
    return code


def cmd_suite(args) -> int:
    import time
    from pathlib import Path

    from testbed.scenario import runner
    from testbed.scenario.suite import (collect_paths, load_all, run_suite, select,
                                        suite_overview)

    if args.seeds < 1:
        print(f"testbed suite: --seeds must be at least 1, got {args.seeds}", file=sys.stderr)
        return 2
    scenarios, skipped = select(load_all(collect_paths(args.paths)), args.only, args.skip)
    if getattr(args, "clock", None) == "virtual":  # what it cannot model is left out, said why
        from testbed.scenario.virtual import unsupported

        for sc in [sc for sc in scenarios if unsupported(sc)]:
            print(f"testbed suite: {sc.name} left out: the virtual clock refuses it: "
                  + "; ".join(unsupported(sc)), file=sys.stderr)
            skipped = [*skipped, sc.name]
        scenarios = [sc for sc in scenarios if not unsupported(sc)]
    out = Path(args.out) if args.out else Path("runs") / f"suite-{time.strftime('%Y%m%d-%H%M%S')}"
    run = runner.run_scenario
    if args.seeds > 1:  # each scenario on N seeds, judged over them (testbed/scenario/seeds.py)
        from testbed.scenario.seeds import seeds_run

        run = seeds_run(args.seeds, run)
    with out_dir_lock(out, "testbed suite"):
        suite = run_suite(scenarios, _run_options(args, out), run,
                          Path(args.junit) if args.junit else None, skipped)
    print(suite_overview(suite))
    print(f"suite: {out / 'suite.md'}" + (f", {args.junit}" if args.junit else ""))
    if suite.interrupted:
        print(f"testbed: interrupted; the network was torn down; what finished is in "
              f"{out / 'suite.json'}", file=sys.stderr)
    return suite.exit_code


def cmd_spread(args) -> int:
    """Run one scenario N times on its seed and once on each of M other seeds (or read
    runs already made), then tabulate each expectation's values across the runs:
    OUT/spread.json and OUT/spread.md (testbed/report/spread.py)."""
    from pathlib import Path

    from testbed.report.spread import load_summaries, spread, spread_markdown

    if args.from_runs:
        dirs = [Path(d) for d in args.from_runs]
        name = load_summaries(dirs[:1])[0][1].get("scenario", dirs[0].name)
        out = Path(args.out) if args.out else dirs[0].parent
    else:
        if not args.scenario:
            print("testbed spread: a scenario, or --from-runs DIR...", file=sys.stderr)
            return 2
        from testbed.scenario.runner import run_scenario
        from testbed.spec.scenario import load_scenario, with_seed

        sc = load_scenario(args.scenario)
        name, seed0 = sc.name, sc.seed if args.seed is None else args.seed
        out = Path(args.out) if args.out else Path("runs") / f"spread-{sc.name}"
        plan = [(f"seed{seed0}-{i}", seed0) for i in range(1, args.runs + 1)]
        plan += [(f"seed{seed0 + j}", seed0 + j) for j in range(1, args.seeds + 1)]
        dirs = []
        for i, (label, seed) in enumerate(plan):
            d = out / label
            dirs.append(d)
            if args.resume and (d / "summary.json").is_file():
                continue
            # a virtual run repeats exactly on its seed: run i breaks ties with tie seed i
            opts = dataclasses.replace(_run_options(args, d), tie_seed=i)
            with out_dir_lock(d, "testbed spread " + args.scenario):
                run_scenario(with_seed(sc, seed), opts)
    result = spread(load_summaries(dirs))
    out.mkdir(parents=True, exist_ok=True)
    (out / "spread.json").write_text(json.dumps({"scenario": name, **result}, indent=1) + "\n")
    text = spread_markdown(name, result)
    (out / "spread.md").write_text(text)
    print(text + f"spread: {out / 'spread.md'}")
    return 1 if any(e["inside"] or e["flips"] for e in result["expectations"]) else 0


def cmd_crossval(args) -> int:
    """Every scenario on the virtual clock beside the emulator's runs of it (made here or
    found): OUT/crossval.md and .json (testbed/scenario/crossval.py)."""
    from pathlib import Path

    from testbed.scenario.crossval import run_crossval

    out = Path(args.out)
    with out_dir_lock(out, "testbed crossval"):
        run_crossval(args.paths, out, _run_options(args, out), args.emulated_runs,
                     [Path(d) for d in args.emulated_from], args.virtual_runs)
    print((out / "crossval.md").read_text() + f"crossval: {out / 'crossval.md'}")
    return 0


def cmd_report(args) -> int:
    from pathlib import Path

    from testbed.report import build_report
    from testbed.report.summary import summary_table

    summary = build_report(Path(args.run_dir))
    print(summary_table(summary))
    from testbed.report.summary import exit_code

    return _fidelity_exit(summary, exit_code(summary))


def cmd_compare(args) -> int:
    from testbed.report.compare import compare_runs, format_comparison
    from testbed.report.rundir import load_run

    runs = [load_run(d) for d in args.run_dirs]
    labels = args.labels or [f"{r.path.name} ({r.metadata.get('backend', '?')})" for r in runs]
    if len(labels) != len(runs):
        raise TestbedError(f"--labels: {len(labels)} labels for {len(runs)} run directories")
    print(" | ".join(f"{lab}: {r.path}, kernel {r.metadata.get('kernel', '?')}, k="
                     f"{r.scale:g}" for lab, r in zip(labels, runs)))
    print(format_comparison(compare_runs(runs), labels))
    return 0


def cmd_reproduce(args) -> int:
    """The paper's claims: run their scenarios (or read --from-runs), write the table."""
    from pathlib import Path

    from testbed.report.capacity import load_capacity_config
    from testbed.report.reproduce import PAPER_SCALE, format_summary, reproduce

    run_fn = bench_fn = None
    if not args.from_runs:
        from dataclasses import replace

        from testbed.bench.handoff import run_handoff_bench
        from testbed.scenario.runner import run_scenario
        from testbed.spec.scenario import load_scenario
        from testbed.spec.topology import load_topology

        opts = _run_options(args, Path(args.out))

        def run_fn(scenario: Path, out: Path, scale: float | None = None) -> None:
            run_scenario(load_scenario(scenario),
                         replace(opts, out_dir=out, scale=opts.scale if scale is None else scale))

        def bench_fn(trials: int) -> dict:
            return run_handoff_bench(load_topology(DEFAULT_TOPOLOGY), _backend(args.backend),
                                     args.scale, trials)
    virtual = getattr(args, "clock", None) == "virtual"
    draws = args.seeds if args.seeds is not None else 10 if virtual else 1
    if draws > 1 or (args.from_runs and any(Path(args.from_runs).glob("draw-*"))):
        return _reproduce_draws(args, draws, virtual)
    with out_dir_lock(args.out, "testbed reproduce"):
        doc = reproduce(Path(args.out), args.quick, run_fn, bench_fn,
                        Path(args.from_runs) if args.from_runs else None,
                        load_capacity_config(args.capacity),
                        " ".join(["testbed"] + sys.argv[1:]),
                        scale_sweep=args.scale_sweep, resume=args.resume,
                        slots=PAPER_SCALE if virtual else None)
    print(format_summary(doc))
    print(f"table: {Path(args.out) / 'reproduction.md'}")
    return 1 if any(r.get("error") for r in (doc.get("runs") or {}).values()) else 0


def _reproduce_draws(args, draws: int, virtual: bool) -> int:
    """``reproduce --seeds N`` (the default on the virtual clock: 10): N draws of every
    slot, each claim's figures with a 95% interval (testbed/report/reproduce_draws.py).
    The virtual clock runs the paper-scale slots; the emulator, the full or quick set."""
    from dataclasses import replace
    from pathlib import Path

    from testbed.report.capacity import load_capacity_config
    from testbed.report.reproduce import FULL, PAPER_SCALE, QUICK
    from testbed.report.reproduce_draws import reproduce_draws

    if args.scale_sweep:
        raise TestbedError("reproduce: --scale-sweep runs one draw; leave out --seeds")
    slots = PAPER_SCALE if virtual else QUICK if args.quick else FULL
    run_fn = None
    if not args.from_runs:
        from testbed.scenario.runner import run_scenario
        from testbed.spec.scenario import load_scenario, with_seed

        opts = _run_options(args, Path(args.out))

        def run_fn(scenario: Path, out: Path, scale: float | None, offset: int) -> None:
            sc = load_scenario(scenario)
            seed = (sc.seed if args.seed is None else args.seed) + offset
            run_scenario(with_seed(sc, seed), replace(
                opts, out_dir=out, seed=seed, scale=opts.scale if scale is None else scale))
    with out_dir_lock(args.out, "testbed reproduce --seeds"):
        doc = reproduce_draws(Path(args.out), draws, run_fn, slots,
                              load_capacity_config(args.capacity),
                              " ".join(["testbed"] + sys.argv[1:]), resume=args.resume,
                              from_runs=Path(args.from_runs) if args.from_runs else None)
    for c in doc["claims"]:
        counts = ", ".join(f"{v} {k}" for k, v in c["verdicts"].items())
        print(f"{c['key']:>3} {c['verdict']:<22} ({counts}) {c['title']}")
    print(f"table: {Path(args.out) / 'reproduction.md'}")
    return 1 if doc.get("errors") else 0


def cmd_capacity(args) -> int:
    from testbed.report.capacity import format_plan, load_capacity_config, plan

    out = plan(load_capacity_config(args.config))
    print(json.dumps(out, indent=1) if args.json else format_plan(out))
    return 0


def _print_json(out: dict, path: str | None) -> None:
    """``out`` as indented JSON on stdout, and into ``path`` when given."""
    from pathlib import Path

    text = json.dumps(out, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")


def cmd_bench_fuzz(args) -> int:
    from testbed.spec.fuzz import run_fuzz

    out = run_fuzz(args.cases, args.seed)
    _print_json(out, args.out)
    return 1 if out["tracebacks_total"] else 0


def cmd_bench_chaos(args) -> int:
    from testbed.scenario.chaos import run_chaos

    if args.cycles < 1:
        raise TestbedError(f"--cycles: expected >= 1, got {args.cycles}")
    if args.scenario is not None:
        from testbed.spec.scenario import load_scenario

        load_scenario(args.scenario)  # a bad file: exit 2 before anything starts
    out = run_chaos(args.cycles, args.seed, args.scenario, args.window_s, kill=args.kill)
    _print_json(out, args.out)
    return 1 if out["leftovers_total"] or out["outcome_problems_total"] else 0


def cmd_bench_soak(args) -> int:
    """A long run judged on what the role processes hold over time (its scenario's
    bounds on memory and descriptor slopes); prints each role's figures, writes them to
    OUT/soak.json beside the run's report."""
    import time
    from pathlib import Path

    from testbed.report.summary import exit_code, summary_table
    from testbed.scenario.runner import RunOptions, run_scenario
    from testbed.spec.scenario import load_scenario

    sc = load_scenario(args.scenario or str(Path(__file__).resolve().parent.parent / SOAK_SCENARIO))
    out = Path(args.out) if args.out else Path("runs") / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    opts = RunOptions(out, None, args.scale, None if args.backend == "auto" else args.backend,
                      engine=args.engine)
    with out_dir_lock(out, "testbed bench soak"):
        summary = run_scenario(sc, opts)
    soak = {"scenario": summary["scenario"], "passed": summary["passed"],
            "failures": summary["failures"], "fidelity": summary["fidelity"]["verdict"],
            "resources": summary["resources"]}
    (out / "soak.json").write_text(json.dumps(soak, indent=1) + "\n")
    print(summary_table(summary))
    for mode, res in summary["resources"].items():
        for name, f in res["instances"].items():
            print(f"{mode} {name:<8} {f['minutes']:g} min  RSS {f['rss_first_mb']:g} -> "
                  f"{f['rss_last_mb']:g} MB (peak {f['rss_peak_mb']:g}), "
                  f"{f['rss_slope_mb_per_min']} MB/min; fds {f['fds_first']} -> {f['fds_last']}, "
                  f"{f['fd_slope_per_min']}/min")
    print(f"report: {out / 'report.md'}, {out / 'soak.json'}")
    return _fidelity_exit(summary, exit_code(summary))


def cmd_bench(args) -> int:
    if args.what == "soak":
        return cmd_bench_soak(args)
    if args.what == "clients":
        return cmd_bench_clients(args)
    if args.what == "fuzz":
        return cmd_bench_fuzz(args)
    if args.what == "chaos":
        return cmd_bench_chaos(args)
    if args.what == "updown":
        from testbed.net.updown import updown

        out = updown(_load_topology(args), args.cycles, _backend(args.backend))
        print(json.dumps(out, indent=1))
        return 1 if out["leftovers"] else 0
    from testbed.bench.handoff import run_handoff_bench

    out = run_handoff_bench(_load_topology(args), _backend(args.backend), args.scale,
                            args.trials)
    print(json.dumps(out, indent=1))
    return 0


def cmd_shell(args) -> int:
    from testbed.net.build import open_network
    from testbed.net.shell import run_shell

    with open_network(_load_topology(args), _backend(args.backend), args.scale) as net:
        run_shell(net)
    return 0


def cmd_export(args) -> int:
    from pathlib import Path

    from testbed.export.build import ExportOptions
    from testbed.export.write import export_k8s

    opts = ExportOptions(image=args.image, dc_node_label=args.dc_node_label,
                         accelerator=args.accelerator, cluster_domain=args.cluster_domain)
    out = Path(args.out)
    exp, files = export_k8s(args.scenario, out, opts)
    for m in exp.modes:
        print(f"{m.name}: namespace {m.namespace}: kubectl apply --server-side -f {out / m.name}")
    for note in exp.notes:
        print(f"note: {note}")
    print(f"{len(files)} manifest files in {out} (export.json lists them)")
    return 0


def cmd_collect(args) -> int:
    from pathlib import Path

    from testbed.export.collect import collect
    from testbed.report import build_report
    from testbed.report.summary import summary_table

    import json

    verified = collect(Path(args.export_dir), Path(args.out))
    for mode, v in verified.items():
        print(f"{mode}: {v['checked']} requests verified, {len(v['mismatched'])} mismatched")
    meta = json.loads((Path(args.out) / "metadata.json").read_text())
    for name in meta.get("expectations_not_checked", []):
        print(f"not checked (its mode has no results): {name}")
    summary = build_report(Path(args.out))
    print(summary_table(summary))
    return 0 if summary["passed"] else 1


def _serve_plan(topology: str | None, scenario: str | None, mode: str, out, port: int,
                backend: str, scale: float | None, seed: int | None, ready_timeout_s: float,
                command: list[str], mooncake_rows: int = 0):
    """(topology, ServeOptions) of one serve run: a topology file, or a scenario's
    topology, seed, scale, backend, mode's pdd settings and workload."""
    from pathlib import Path

    from testbed.scenario.serve import ServeOptions

    pdd = workload = None
    workload_dir = Path(".")
    if scenario:
        from testbed.spec.scenario import load_scenario

        if topology is not None:
            raise TestbedError("serve: give a topology or --scenario (its topology), not both")
        if mooncake_rows:
            raise TestbedError("serve: --mooncake-rows and --scenario both set {trace}; "
                               "give one")
        sc = load_scenario(scenario)
        run = next((m for m in sc.modes if m.mode.value == mode), None)
        if run is None:
            raise SpecError(scenario, "modes", f"a list with mode {mode} (--mode)",
                            [m.name for m in sc.modes])
        topo, pdd, workload = sc.topology, run.pdd, run.workload
        workload_dir = Path(sc.file).parent
        seed, scale, backend = sc.overridden(seed, scale, None if backend == "auto" else backend)
    else:
        from testbed.spec.topology import load_topology

        topo = load_topology(topology or DEFAULT_TOPOLOGY)
    opts = ServeOptions(Path(out), port, None if backend == "auto" else backend,
                        scale, 1 if seed is None else seed, ready_timeout_s,
                        tuple(command), mooncake_rows, pdd, workload, workload_dir)
    return topo, opts


def cmd_serve(args) -> int:
    import time
    from pathlib import Path

    from testbed.pdd.run.client_command import client_argv
    from testbed.scenario.serve import serve
    from testbed.types import Mode

    out = Path(args.out) if args.out else Path("runs") / f"serve-{time.strftime('%Y%m%d-%H%M%S')}"
    client_argv(args.client_command, "0.0.0.0", args.port, out, "m", Path("t"), Path("x"))
    topo, opts = _serve_plan(args.topology, args.scenario, args.mode, out, args.port,
                             args.backend, args.scale, args.seed, args.ready_timeout_s,
                             args.client_command, args.mooncake_rows)
    with out_dir_lock(out, "testbed serve"):
        result = serve(topo, Mode(args.mode), opts)
    print(f"testbed: stopped; {result['checked']} requests verified against greedy decode, "
          f"{len(result['mismatched'])} mismatched; records in {out / 'requests.jsonl'}")
    if result["mismatched"]:
        return 1
    return result.get("client_exit", 0)


def cmd_bench_clients(args) -> int:
    """AIPerf and GuideLLM, unmodified, against serve's gateway per mode; the table."""
    import time
    from pathlib import Path

    from testbed.bench.clients import (MODES, REPO, check_clients, default_paths, run_clients,
                                       selected)
    from testbed.scenario.serve import serve
    from testbed.types import Mode

    out = Path(args.out or f"runs/clients-{time.strftime('%Y%m%d-%H%M%S')}")
    runs = selected(args.only)
    paths = default_paths()
    paths.update({k: v for k, v in (("aiperf", args.aiperf), ("guidellm", args.guidellm)) if v})
    modes = args.modes or list(MODES)
    if args.requests < 1:
        raise SpecError("command line", "--requests", "an integer >= 1", args.requests)
    if not args.rate > 0:  # NaN too
        raise SpecError("command line", "--rate", "a number > 0 (req/s)", args.rate)
    check_clients(runs, paths)  # before anything is built or written

    def serve_fn(run, mode: str, command: list[str], cell: Path) -> None:
        scenario = str(REPO / run.scenario) if run.scenario else None
        topo, opts = _serve_plan(None if scenario else args.topology, scenario, mode, cell,
                                 8000, args.backend, args.scale, None, 60.0, command)
        print(f"testbed: bench clients: {run.name} / {mode} -> {cell}", flush=True)
        result = serve(topo, Mode(mode), opts)
        print(f"testbed: bench clients: {run.name} / {mode}: client exit "
              f"{result.get('client_exit')}, {result['checked']} requests verified, "
              f"{len(result['mismatched'])} mismatched", flush=True)

    with out_dir_lock(out, "testbed bench clients"):
        doc = run_clients(out, runs, modes, serve_fn, paths, args.requests, args.rate)
    print((out / "clients.md").read_text(), end="")
    return 0 if doc["passed"] else 1


def cmd_exec(args) -> int:
    from testbed.scenario.serve import run_in_host

    return run_in_host(args.host, args.exec_command, args.prefix)


def cmd_clean(args) -> int:
    from testbed.net.registry import clean_stale

    done = clean_stale(include_live=args.all)
    for prefix, failures in done:
        print(f"{prefix}: " + ("removed" if not failures else "; ".join(failures)))
    if not done:
        print("nothing to clean")
    return 1 if any(f for _, f in done) else 0


def _net_args(p, topology: bool = True) -> None:
    if topology:
        p.add_argument("topology", nargs="?", default=DEFAULT_TOPOLOGY)
    p.add_argument("--backend", choices=("auto", "netem", "userspace"), default="auto")
    p.add_argument("--scale", type=float, default=None, help="bandwidth scale k (default: auto)")


def _run_args(p, pcap_default: bool = False) -> None:
    """The options ``run`` and ``suite`` pass to every scenario (RunOptions); ``reproduce``
    captures the WAN by default (``--no-pcap``)."""
    p.add_argument("--seed", type=int)
    p.add_argument("--scale", type=float, help="bandwidth scale k (default: scenario or auto)")
    p.add_argument("--backend", choices=("auto", "netem", "userspace"), default="auto")
    p.add_argument("--ready-timeout-s", type=float, default=60.0,
                   help="how long each role may take to start (a qemu guest: 900)")
    p.add_argument("--preflight-tol-ms", type=float, default=3.0,
                   help="WAN RTT tolerance of the preflight ping (a qemu guest: 10)")
    p.add_argument("--engine", choices=("torch", "hash"), default=None,
                   help="every mode's compute engine (default: the scenario's pdd.engine)")
    p.add_argument("--clock", choices=("emulated", "virtual"), default=None,
                   help="emulated: role processes in the emulated network (root); virtual: "
                   "the same roles in one process on a simulated clock over a network model "
                   "(no root; default: the scenario's clock)")
    p.add_argument("--tie-seed", type=int, default=0,
                   help="virtual clock: the seed that breaks ties between timers due at one "
                   "instant (simultaneous arrivals' order at P), as a real machine's noise does")
    what = ("a bounded capture of the WAN per mode (MODE/wan.pcap, 128-byte snap, at most "
            "200k packets), analysed in the report (MODE/pcap.json)")
    if pcap_default:
        p.add_argument("--no-pcap", dest="pcap", action="store_false", help="do not keep " + what)
    else:
        p.add_argument("--pcap", action="store_true", help="keep " + what)


def _modes():
    from testbed.types import Mode

    return list(Mode)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="testbed", description=__doc__.splitlines()[0])
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check YAML files (no root)")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("plan", help="print the network plan of a topology (no root)")
    _net_args(p)
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("check", help="kernel features, tools, backend and its capacity, "
                                     "and how late the host wakes a real-time thread")
    _net_args(p)
    p.add_argument("--no-measure", action="store_true",
                   help="skip the measurements (capacity, wake-ups)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("calibrate", help="measure each link against its configuration")
    _net_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--links", nargs="*", help="e.g. wan host:p1 (default: all)")
    p.add_argument("--wan-rate-gbit", type=float)
    p.add_argument("--wan-rtt-ms", type=float)
    p.add_argument("--wan-loss-pct", type=float)
    p.add_argument("--shaper-rate", action="store_true",
                   help="also the shaper's own rate: UDP offered at 1.2x, what arrives")
    p.set_defaults(func=cmd_calibrate)
    p = sub.add_parser("run", help="run a scenario: every mode, faults, report")
    p.add_argument("scenario")
    p.add_argument("--out", help="run directory (default runs/NAME-TIME)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="run N seeds (the scenario's or --seed, and the next ones) into "
                   "OUT/seed-K; OUT/seeds.md: every metric and ratio with a 95%% interval")
    _run_args(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan, build nothing")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("suite", help="run many scenarios one after another: verdict matrix, "
                       "suite.json, suite.md, JUnit XML")
    p.add_argument("paths", nargs="*", default=["scenarios"],
                   help="scenario files and/or directories (their *.yaml); default scenarios/")
    p.add_argument("--out", help="suite directory, a run directory per scenario in it "
                   "(default runs/suite-TIME)")
    p.add_argument("--junit", help="also write JUnit XML to this file")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only this scenario (repeatable)")
    p.add_argument("--skip", action="append", default=[], metavar="NAME",
                   help="leave this scenario out (repeatable)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="run each scenario on N seeds (its own or --seed, and the next ones) "
                   "into NAME/seed-K; the matrix judges each expectation over them (its "
                   "median or its 95%% interval's conservative end) and shows the interval; "
                   "NAME/seeds.md has every metric and ratio")
    _run_args(p)
    p.set_defaults(func=cmd_suite)
    p = sub.add_parser("crossval", help="the virtual clock against the emulator: each "
                       "scenario on both, the error per metric (crossval.md)")
    p.add_argument("paths", nargs="*", default=["scenarios"],
                   help="scenario files and/or directories (default scenarios/)")
    p.add_argument("--out", required=True, help="folder: NAME/virtual-tieN, NAME/emulated-N, "
                   "the table")
    p.add_argument("--emulated-runs", type=int, default=0, metavar="N",
                   help="emulated runs per scenario to make here (root)")
    p.add_argument("--virtual-runs", type=int, default=3, metavar="N",
                   help="virtual runs per scenario, on tie seeds 0..N-1 (default 3)")
    p.add_argument("--emulated-from", nargs="*", default=[], metavar="DIR",
                   help="folders holding emulated run directories made before (a suite's, "
                   "a spread's): those of each scenario on its seed are its reference")
    _run_args(p)
    p.set_defaults(func=cmd_crossval)
    p = sub.add_parser("reproduce", help="the paper's claims side by side with measured "
                       "figures: reproduction.md/.json (runs its scenarios, or --from-runs)")
    p.add_argument("--out", required=True, help="folder: a run directory per slot + the table")
    p.add_argument("--quick", action="store_true", help="the short set (~15 min on 2 cores)")
    p.add_argument("--from-runs", metavar="DIR", help="build the table from DIR's run "
                   "directories (DIR/SLOT, DIR/handoff-bench.json); run nothing")
    p.add_argument("--capacity", metavar="YAML", help="claim 7's prices/chips (testbed capacity)")
    p.add_argument("--resume", action="store_true", help="keep the slots an earlier run into "
                   "--out finished (its reproduction.json) and run the rest")
    p.add_argument("--scale-sweep", action="store_true", help="also run the headline comparison "
                   "at k = 10, 25, 50, 100 and two token_scale values (scale invariance table)")
    p.add_argument("--seeds", type=int, default=None, metavar="N",
                   help="N draws of every slot (its seed + 0..N-1), each claim's figures with a "
                   "95%% interval (default 10 with --clock virtual, which runs the paper-scale "
                   "fleet's slots; else 1)")
    _run_args(p, pcap_default=True)
    p.set_defaults(func=cmd_reproduce)
    p = sub.add_parser("capacity", help="capacity plan: PDD vs same-DC PD fleets, cost, BCR "
                       "(cost model; prices and chips from an optional YAML)")
    p.add_argument("--config", metavar="YAML", help="see testbed/report/capacity.py")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_capacity)
    p = sub.add_parser("spread", help="a scenario's run-to-run spread: N runs on its seed, "
                       "M on other seeds, each expectation's values, min/median/max, and "
                       "whether its bound lies inside them (spread.md, spread.json)")
    p.add_argument("scenario", nargs="?")
    p.add_argument("--runs", type=int, default=3, help="runs on the scenario's seed")
    p.add_argument("--seeds", type=int, default=2, help="runs on the next seeds, one each")
    p.add_argument("--out", help="folder: a run directory per run + spread.md "
                   "(default runs/spread-NAME)")
    p.add_argument("--from-runs", nargs="+", metavar="DIR", help="tabulate these run "
                   "directories of one scenario; run nothing (no root)")
    p.add_argument("--resume", action="store_true", help="keep runs that have a summary.json")
    _run_args(p)
    p.set_defaults(func=cmd_spread)
    p = sub.add_parser("report", help="re-render summary.json, report.md and plots")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("compare", help="runs side by side (e.g. one scenario, two backends)")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--labels", nargs="+", help="column names (default: folder and backend)")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("bench", help="benchmarks: updown (build/teardown), handoff, "
                       "fuzz (input readers, no root), chaos (kill campaign), clients "
                       "(AIPerf and GuideLLM against serve, per mode), soak (a 33-minute "
                       "Mooncake replay judged on the roles' memory and descriptor slopes)")
    p.add_argument("what", choices=("updown", "handoff", "fuzz", "chaos", "clients", "soak"))
    _net_args(p)
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--cases", type=int, default=10_000, help="fuzz: inputs per reader")
    p.add_argument("--seed", type=int, default=1, help="fuzz, chaos: random seed")
    p.add_argument("--out", help="fuzz, chaos: also write the JSON result to this file; "
                   "clients: the folder (a serve run per client run and mode, clients.md, "
                   "clients.json; default runs/clients-TIME); soak: the run's folder "
                   "(default runs/soak-TIME)")
    p.add_argument("--only", action="append", default=[], metavar="RUN",
                   help="clients: only this run (aiperf-synthetic, aiperf-mooncake, "
                   "guidellm-synthetic; repeatable)")
    p.add_argument("--mode", dest="modes", action="append", default=[],
                   choices=[m.value for m in _modes()],
                   help="clients: only this mode (repeatable; default pdd and cross-dc-pd)")
    p.add_argument("--aiperf", help="clients: AIPerf's executable (default .venv-bench/bin/aiperf "
                   "at the repository's top)")
    p.add_argument("--guidellm", help="clients: GuideLLM's executable (default "
                   ".venv-guidellm/bin/guidellm)")
    p.add_argument("--requests", type=int, default=40,
                   help="clients: requests of each synthetic run")
    p.add_argument("--rate", type=float, default=2.0,
                   help="clients: request rate of each synthetic run (req/s)")
    p.add_argument("--scenario", help="chaos: the scenario each cycle runs "
                   "(default tests/chaos/chaos-tiny.yaml); soak: the scenario "
                   f"(default {SOAK_SCENARIO})")
    p.add_argument("--window-s", type=float, default=25.0,
                   help="chaos: the kill comes at a uniform moment in [0.5, this] s")
    p.add_argument("--engine", choices=("torch", "hash"), default=None,
                   help="soak: the roles' compute engine (default: the scenario's)")
    from testbed.scenario.chaos import KILL_TARGETS

    p.add_argument("--kill", default="alternate", choices=KILL_TARGETS,
                   help="chaos: what each cycle kills (alternate: the runner in even cycles, "
                   "a random role in odd ones)")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("shell", help="Mininet CLI on the emulated network")
    _net_args(p)
    p.set_defaults(func=cmd_shell)
    p = sub.add_parser("export", help="a scenario as Kubernetes manifests with Chaos Mesh "
                       "shaping the WAN and running the faults (no root, no cluster)")
    p.add_argument("target", choices=("k8s",))
    p.add_argument("scenario")
    p.add_argument("--out", required=True, help="folder: one subfolder of manifests per mode")
    p.add_argument("--image", default=DEFAULT_IMAGE, help="the roles' image (Containerfile)")
    p.add_argument("--dc-node-label", default=DEFAULT_DC_NODE_LABEL,
                   help="node label whose value is a datacenter name (e.g. a, b)")
    p.add_argument("--accelerator", help="also request the cost model's chips per P/RLD/MD "
                   "as this extended resource (e.g. nvidia.com/gpu)")
    p.add_argument("--cluster-domain", default="cluster.local")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("collect", help="a cluster run's copied results as a run directory, "
                       "then its report")
    p.add_argument("export_dir", help="the export folder, results copied into MODE/results")
    p.add_argument("--out", required=True, help="run directory to write")
    p.set_defaults(func=cmd_collect)
    p = sub.add_parser("serve", help="network + PDD roles + OpenAI-compatible gateway up "
                       "until Ctrl-C (for external benchmark clients)")
    p.add_argument("topology", nargs="?", default=None,
                   help=f"topology file (default {DEFAULT_TOPOLOGY}; with --scenario, its own)")
    _net_args(p, topology=False)
    p.add_argument("--scenario", metavar="FILE",
                   help="take the topology, the mode's pdd settings, seed, scale, backend and "
                   "(a Mooncake workload) {trace} from this scenario")
    p.add_argument("--mode", default="pdd", choices=[m.value for m in _modes()])
    p.add_argument("--port", type=int, default=8000, help="the gateway's HTTP port")
    p.add_argument("--out", help="folder for config, logs, requests.jsonl (default "
                   "runs/serve-TIME)")
    p.add_argument("--seed", type=int, default=None, help="default: the scenario's, else 1")
    p.add_argument("--ready-timeout-s", type=float, default=60.0)
    p.add_argument("--mooncake-rows", type=int, default=0, metavar="N",
                   help="with a client command: write OUT/mooncake-slice.jsonl ({trace}), "
                   "the first N rows of the shipped Mooncake trace scaled for the tiny model")
    p.set_defaults(func=cmd_serve, client_command=[])
    p.epilog = ("After a lone --, a client command to run in the client host once the "
                "gateway answers ({url}, {base_url}, {model}, {tokenizer}, {out}, {trace}, "
                "{block_tokens} are filled in); serve stops when it ends and exits with its code.")
    p = sub.add_parser("exec", help="run a command inside a host of a live `testbed serve`",
                       usage="testbed exec [-h] [--prefix PREFIX] host -- COMMAND [ARGS ...]",
                       epilog="Everything after the first lone -- is the command, unchanged "
                       "(a later -- included).")
    p.add_argument("host", help="topology host name, e.g. client")
    p.add_argument("--prefix", help="the run (tbXXXX) when several are live")
    p.set_defaults(func=cmd_exec, exec_command=[])
    p = sub.add_parser("clean", help="remove what dead testbed runs left (state files only)")
    p.add_argument("--all", action="store_true", help="also runs whose owner is alive")
    p.set_defaults(func=cmd_clean)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line; for ``exec`` and ``serve``, everything after its first
    lone ``--`` is the command, unchanged (argparse would drop a later ``--`` too)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    i = argv.index("--") if "--" in argv else len(argv)
    sub = next((a for a in argv[:i] if not a.startswith("-")), None)
    if sub not in ("exec", "serve") or i == len(argv):
        args = ap.parse_args(argv)
        if sub == "exec" and not getattr(args, "exec_command", None):
            ap.error("exec: no command given (testbed exec HOST -- COMMAND [ARGS ...])")
        return args
    args = ap.parse_args(argv[:i])
    command = argv[i + 1:]
    if not command:
        ap.error(f"{sub}: nothing after -- (a command was expected)")
    if sub == "exec":
        args.exec_command = command
    else:
        args.client_command = command
    return args


def own_sigint() -> None:
    """SIGINT raises KeyboardInterrupt, whatever the parent set: a non-interactive shell
    starts a background job (``testbed serve ... &``) with SIGINT ignored, and Python
    keeps an ignored SIGINT ignored, so Ctrl-C and ``kill -INT`` would leave it serving."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    own_sigint()
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except SpecError as e:
        print(f"testbed: invalid input: {e}", file=sys.stderr)
        return 2
    except TestbedError as e:
        print(f"testbed: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("testbed: interrupted; the network was torn down", file=sys.stderr)
        return 130
    except Exception as e:  # SIGTERM/SIGHUP arrive as net.apply.Terminated
        from testbed.net.apply import Terminated

        if not isinstance(e, Terminated):
            raise
        print(f"testbed: terminated ({e}); the network was torn down", file=sys.stderr)
        return 143


if __name__ == "__main__":
    sys.exit(main())
