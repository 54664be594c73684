"""``python -m testbed.vm``: argument parsing and exit codes only.

    python -m testbed.vm prepare [--refresh]        # fetch the kernel, build the initramfs
    python -m testbed.vm run [--results DIR] -- COMMAND...
    python -m testbed.vm netem-check [--scale 100] [--results DIR] [--json]
    python -m testbed.vm scenario SCENARIO.yaml --backend netem|userspace --out RUN_DIR

``scenario`` runs ``testbed run`` in the guest (one vCPU, TSC clock, 4 GB:
SCENARIO_VM) with the role start-up allowance raised for software
emulation; RUN_DIR gets the run directory and, beside it, the guest's
run.sh, stdout, stderr, exit_code and console.log.

Exit codes: ``run`` and ``scenario`` return the guest command's exit code; ``netem-check``
0 (all figures within tolerance) or 1; 2 the guest could not be prepared,
booted or did not report; 130 interrupted (qemu is killed).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from testbed.vm.errors import VmError
from testbed.vm.guest import DEFAULT_CACHE, VmConfig, prepare, run_in_guest


def _results_dir(given: Path | None, what: str) -> Path:
    if given is not None:
        return given
    return DEFAULT_CACHE / "runs" / f"{what}-{time.strftime('%Y%m%d-%H%M%S')}"


def cmd_prepare(args) -> int:
    t0 = time.monotonic()
    prep = prepare(VmConfig(), refresh=args.refresh)
    print(f"kernel     {prep.kernel.version}\nvmlinux    {prep.kernel.vmlinux}\n"
          f"initramfs  {prep.initramfs}\nready in   {time.monotonic() - t0:.1f} s")
    return 0


def cmd_run(args) -> int:
    if not args.command:
        print("testbed.vm run: give a command after --", file=sys.stderr)
        return 2
    config = VmConfig(memory_mb=args.memory_mb, cpus=args.cpus)
    command = args.command[0] if len(args.command) == 1 and Path(args.command[0]).is_file() \
        else args.command
    r = run_in_guest(command, _results_dir(args.results, "run"), args.timeout, config)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    print(f"testbed.vm: exit {r.exit_code}, {r.wall_s:.1f} s wall (guest booted in "
          f"{r.boot_s} s), results in {r.results_dir}", file=sys.stderr)
    return r.exit_code


def cmd_scenario(args) -> int:
    from testbed.vm.netem_check import SCENARIO_VM

    out = args.out.resolve()
    argv = [sys.executable, "-m", "testbed.cli", "run", str(args.scenario.resolve()),
            "--backend", args.backend, "--out", str(out),
            "--ready-timeout-s", f"{args.ready_timeout_s:g}",
            "--preflight-tol-ms", f"{args.preflight_tol_ms:g}"]
    if args.scale is not None:
        argv += ["--scale", f"{args.scale:g}"]
    config = SCENARIO_VM if args.memory_mb is None else \
        replace(SCENARIO_VM, memory_mb=args.memory_mb)
    r = run_in_guest(argv, out, args.timeout, config)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr[-5000:])
    print(f"testbed.vm: scenario exit {r.exit_code}, {r.wall_s:.1f} s wall (guest booted in "
          f"{r.boot_s} s), run directory {out}", file=sys.stderr)
    return r.exit_code


def cmd_netem_check(args) -> int:
    from testbed.vm.netem_check import check_in_guest, format_rows

    results = _results_dir(args.results, "netem-check")
    check = check_in_guest(results, args.scale, args.timeout)
    if args.json:
        print(json.dumps({"passed": check.passed, "wall_s": check.wall_s,
                          "rows": [asdict(r) for r in check.rows]}, indent=1))
    else:
        print(format_rows(check.rows, check.figures))
        print(f"{'PASS' if check.passed else 'FAIL'}  {check.wall_s:.1f} s wall (guest booted "
              f"in {check.boot_s} s); figures in {results}")
    return 0 if check.passed else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m testbed.vm",
                                 description="run commands in a qemu guest with sch_netem")
    sub = ap.add_subparsers(dest="command_name", required=True)
    p = sub.add_parser("prepare", help="download the kernel and build the initramfs (cached)")
    p.add_argument("--refresh", action="store_true",
                   help="ask apt for the current kernel package even if one is cached")
    p.set_defaults(func=cmd_prepare)
    p = sub.add_parser("run", help="run a command (or a script file) in a guest")
    p.add_argument("--results", type=Path, help="results folder (default .cache/vm/runs/...)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds, boot included")
    p.add_argument("--memory-mb", type=int, default=2048, help="4096 if torch runs inside")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("scenario", help="testbed run SCENARIO in a guest (slow: tens of minutes)")
    p.add_argument("scenario", type=Path)
    p.add_argument("--backend", choices=("netem", "userspace"), default="netem")
    p.add_argument("--out", type=Path, required=True, help="run directory (on the host)")
    p.add_argument("--scale", type=float, help="bandwidth scale k (default: the scenario's)")
    p.add_argument("--timeout", type=float, default=5400.0, help="seconds, boot included")
    p.add_argument("--ready-timeout-s", type=float, default=900.0,
                   help="per role start (torch imports take ~45 s each in the guest)")
    p.add_argument("--preflight-tol-ms", type=float, default=10.0,
                   help="WAN RTT tolerance (the guest adds ~5 ms between client and MD)")
    p.add_argument("--memory-mb", type=int)
    p.set_defaults(func=cmd_scenario)
    p = sub.add_parser("netem-check", help="the netem backend's accuracy, in a guest")
    p.add_argument("--scale", type=float, default=100.0,
                   help="bandwidth scale k (default 100: WAN 10 Gbit/s -> 100 Mbit/s)")
    p.add_argument("--results", type=Path, help="results folder (default .cache/vm/runs/...)")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_netem_check)
    return ap


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # run_in_guest stops qemu on the way out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    if getattr(args, "command", None) and args.command[0] == "--":
        args.command = args.command[1:]
    try:
        return args.func(args)
    except VmError as e:
        print(f"testbed.vm: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("testbed.vm: interrupted; qemu was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
