"""``testbed bench chaos``: a kill campaign against the runner and the roles.

Each cycle snapshots what exists (``take_snapshot``: root-namespace
interfaces, network namespaces, processes, the entries of the testbed's
state folder), starts ``testbed run`` on a short scenario
(tests/chaos/chaos-tiny.yaml by default), SIGKILLs at a seeded random moment
either the runner (even cycles) or one of its role processes picked at
random (odd cycles; the role is found in the run's state file, at the first
moment after the drawn one that the run has roles; ``kill`` narrows the
target: ``runner``, ``role``, or one role such as ``router``), waits for
the runner to end, runs ``testbed clean``, snapshots again and reports
everything the cycle left (``leftovers``): every interface, namespace and
state entry that is new by exact name, and every new process that belongs
to the cycle (its command line names the cycle's run folder, or it sits in
a network namespace the cycle made). Nothing is removed here: a leftover
stays for the operator to see (``testbed clean`` is what must remove it).

A role kill lets the runner go on, so each such cycle also judges what the
run delivered (``judge_outcome``): the runner ended by itself with its
report (exit 0 or 1 and summary.json), every request of the workload has a
record, every request that did not complete says why, and no token reached
the client twice. A killed role is not restarted, so requests may fail
(P lost before their first token; the router gone past their timeout):
failing with a reason is an outcome, losing a request or a token's
uniqueness is not. ``outcome_problems`` lists what broke that. A kill that
lands before the workload starts (a role not yet ready) sends no request:
the runner must then exit 2 naming the role (``testbed run``'s start
failure), and the outcome is ``{}``.

Needs root (the runner builds the network). Result (JSON): seed, cycles,
scenario, one entry per cycle (what was killed, when, exit codes, its
leftovers, the outcome of a role kill) and ``leftovers_total``,
``outcome_problems_total``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.net import naming

DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "tests" / "chaos" / "chaos-tiny.yaml"
ROLE_WHATS = ("prefill ", "relay_decode ", "main_decode ", "router ")
KILL_TARGETS = ("alternate", "runner", "role") + tuple(w.strip() for w in ROLE_WHATS)


@dataclass(frozen=True)
class Process:
    pid: int
    start: int | None  # start time in clock ticks since boot (pid reuse guard)
    cmdline: str
    netns: str  # "net:[inode]" or "" if unreadable


@dataclass(frozen=True)
class Snapshot:
    """What exists on the machine that a testbed run could leave behind."""

    links: frozenset[str] = frozenset()  # root-namespace interfaces, by name
    netns: frozenset[str] = frozenset()  # "net:[inode]" of any process, "netns:NAME" of /run/netns
    processes: tuple[Process, ...] = ()
    state: frozenset[str] = frozenset()  # paths under naming.STATE_DIR, relative

    def process_keys(self) -> set[tuple[int, int | None]]:
        return {(p.pid, p.start) for p in self.processes}


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def take_snapshot(proc: Path = Path("/proc"), sys_net: Path = Path("/sys/class/net"),
                  run_netns: Path = Path("/run/netns"),
                  state_dir: Path | None = None) -> Snapshot:
    """The machine's interfaces, namespaces, processes and testbed state entries now."""
    state_dir = naming.STATE_DIR if state_dir is None else state_dir
    links = frozenset(p.name for p in sys_net.iterdir()) if sys_net.is_dir() else frozenset()
    procs, netns = [], set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            ns = os.readlink(entry / "ns" / "net")
        except OSError:
            ns = ""
        cmd = _read(str(entry / "cmdline")).replace("\0", " ").strip()
        if not cmd and not ns:
            continue  # gone meanwhile, or a kernel thread we cannot read
        procs.append(Process(pid, naming.pid_start_time(pid), cmd, ns))
        if ns:
            netns.add(ns)
    if run_netns.is_dir():
        netns |= {f"netns:{p.name}" for p in run_netns.iterdir()}
    state = frozenset(str(p.relative_to(state_dir)) for p in state_dir.rglob("*")) \
        if state_dir.is_dir() else frozenset()
    return Snapshot(links, frozenset(netns), tuple(procs), state)


def snapshot_leftovers(before: Snapshot, after: Snapshot, marker: str) -> list[str]:
    """What the cycle left: every interface, namespace and state entry in ``after`` but not
    in ``before`` (by exact name), and every process new since ``before`` whose command
    line contains ``marker`` (the cycle's run folder) or that sits in a new namespace.

    >>> a = Snapshot(links=frozenset({"lo", "eth0"}))
    >>> after = Snapshot(links=frozenset({"lo", "eth0", "tb12absa"}))
    >>> snapshot_leftovers(a, after, "/runs/c0")
    ['interface tb12absa']
    """
    new_ns = after.netns - before.netns
    old = before.process_keys()
    out = [f"interface {n}" for n in sorted(after.links - before.links)]
    for ns in sorted(new_ns):
        holders = [p.pid for p in after.processes if p.netns == ns]
        out.append(f"network namespace {ns}" + (f" (held by pids {holders})" if holders else ""))
    for p in after.processes:
        if (p.pid, p.start) in old:
            continue
        if (marker and marker in p.cmdline) or p.netns in new_ns:
            out.append(f"process {p.pid} ({p.cmdline[:120]})")
    out += [f"state {naming.STATE_DIR / s}" for s in sorted(after.state - before.state)]
    return out


def role_pids(state_dir: Path, owner_pid: int) -> list[tuple[int, int | None, str]]:
    """(pid, start, what) of the role processes the run owned by ``owner_pid`` recorded."""
    out = []
    for path in sorted(state_dir.glob("tb*.json")) if state_dir.is_dir() else ():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("owner_pid") != owner_pid:
            continue
        out += [(p["pid"], p.get("start"), p["what"]) for p in record.get("processes", [])
                if str(p.get("what", "")).startswith(ROLE_WHATS)]
    return out


def _testbed_argv() -> list[str]:
    script = Path(sys.executable).parent / "testbed"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from testbed.cli import main; sys.exit(main())"]


def _jsonl(path: Path) -> list[dict]:
    """The complete JSON lines of a file ([] if absent; a cut last line is skipped)."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def judge_outcome(run_dir: Path, runner_exit: int | None) -> tuple[dict, list[str]]:
    """What a run delivered after one of its roles was killed: per mode the workload's
    requests, completed, failed (and their reasons, counted), missing (no record),
    unexplained (not completed, no reason) and tokens duplicated; and the problems
    (module docstring)."""
    started = [p for p in sorted(run_dir.iterdir()) if (p / "workload.jsonl").is_file()
               and any(e.get("kind") == "workload_start" for e in _jsonl(p / "events.jsonl"))] \
        if run_dir.is_dir() else []
    if not started and runner_exit == 2:
        return {}, []  # killed before any workload began: a start failure, exit 2
    problems = []
    if runner_exit not in (0, 1):
        problems.append(f"the runner exited {runner_exit}, not 0 or 1 (a run that reported)")
    if not (run_dir / "summary.json").is_file():
        problems.append(f"no {run_dir / 'summary.json'}: the run did not report")
    modes = {}
    for mode_dir in started:
        wanted = {w["id"] for w in _jsonl(mode_dir / "workload.jsonl") if not w.get("warmup")}
        records = [r for r in _jsonl(mode_dir / "requests.jsonl") if r.get("id") in wanted]
        done = [r for r in records if r.get("status") == "completed"]
        not_done = [r for r in records if r.get("status") != "completed"]
        reasons: dict[str, int] = {}
        for r in not_done:
            why = str(r.get("reason") or "")[:80]
            reasons[why] = reasons.get(why, 0) + 1
        m = {"requests": len(wanted), "completed": len(done), "failed": len(not_done),
             "missing": len(wanted - {r["id"] for r in records}),
             "unexplained": reasons.get("", 0),
             "tokens_duplicated": sum(int(r.get("tokens_duplicated") or 0) for r in records),
             "reasons": {k: v for k, v in sorted(reasons.items()) if k}}
        modes[mode_dir.name] = m
        problems += [f"{mode_dir.name}: {m[k]} {what}" for k, what in (
            ("missing", "requests without a record"),
            ("unexplained", "requests not completed that give no reason"),
            ("tokens_duplicated", "tokens delivered twice")) if m[k]]
    if not modes:
        problems.append(f"no mode folder with a started workload in {run_dir}")
    return modes, problems


@dataclass
class CycleResult:
    cycle: int
    target: str  # "runner", or "role" (any role) or one role's name
    at_s: float  # the seeded moment after the runner's start
    killed: str = ""  # what was SIGKILLed ("" if the run ended first)
    runner_exit: int | None = None
    clean_exit: int | None = None
    clean_output: str = ""
    leftovers: list[str] = field(default_factory=list)
    outcome: dict | None = None  # judge_outcome's modes, after a role kill
    outcome_problems: list[str] = field(default_factory=list)


def cycle_target(i: int, kill: str) -> str:
    """What cycle ``i`` kills: ``alternate`` takes the runner in even cycles and a role in
    odd ones; any other KILL_TARGETS value every time."""
    if kill not in KILL_TARGETS:
        raise ValueError(f"kill: expected one of {', '.join(KILL_TARGETS)}, got {kill!r}")
    if kill == "alternate":
        return "runner" if i % 2 == 0 else "role"
    return kill


def run_cycle(i: int, rng: random.Random, scenario: Path, work: Path, window_s: float,
              runner_timeout_s: float = 300.0, kill: str = "alternate") -> CycleResult:
    """One cycle (see the module docstring)."""
    target = cycle_target(i, kill)
    res = CycleResult(i, target, round(rng.uniform(0.5, window_s), 3))
    pick = rng.random()  # which role, drawn now so the sequence does not depend on timing
    out = work / f"cycle-{i:03d}"
    before = take_snapshot()
    log = open(work / f"cycle-{i:03d}.log", "wb")
    runner = subprocess.Popen(_testbed_argv() + ["run", str(scenario), "--out", str(out)],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    try:
        while runner.poll() is None and time.monotonic() - t0 < res.at_s:
            time.sleep(0.02)
        if runner.poll() is None:
            if target == "runner":
                os.kill(runner.pid, signal.SIGKILL)
                res.killed = f"runner pid {runner.pid}"
            else:  # the roles may not be up yet at the drawn moment: the first one after it
                wanted = ROLE_WHATS if target == "role" else (target + " ",)
                while runner.poll() is None and not (roles := [
                        r for r in role_pids(naming.STATE_DIR, runner.pid)
                        if r[2].startswith(wanted)]):
                    time.sleep(0.05)
                if runner.poll() is None:
                    pid, start, what = roles[int(pick * len(roles))]
                    if naming.pid_start_time(pid) == start:
                        os.kill(pid, signal.SIGKILL)
                        res.killed = (f"{what} pid {pid} at "
                                      f"{time.monotonic() - t0:.2f} s")
        try:
            res.runner_exit = runner.wait(runner_timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(runner.pid, signal.SIGKILL)
            res.runner_exit = runner.wait()
            res.killed += f"; runner hung past {runner_timeout_s:g} s, SIGKILLed"
    finally:
        log.close()
    if target != "runner" and res.killed and not res.killed.endswith("SIGKILLed"):
        res.outcome, res.outcome_problems = judge_outcome(out, res.runner_exit)
    clean = subprocess.run(_testbed_argv() + ["clean"], capture_output=True, text=True,
                           timeout=120)
    res.clean_exit, res.clean_output = clean.returncode, (clean.stdout + clean.stderr).strip()
    deadline = time.monotonic() + 5.0
    while True:  # killed processes may take a moment to be reaped
        res.leftovers = snapshot_leftovers(before, take_snapshot(), str(out))
        if not res.leftovers or time.monotonic() > deadline:
            return res
        time.sleep(0.2)


def run_chaos(cycles: int, seed: int, scenario: Path | None = None,
              window_s: float = 25.0, work: Path | None = None, kill: str = "alternate") -> dict:
    """``cycles`` kill cycles; the JSON-ready result."""
    cycle_target(0, kill)  # a bad target fails before anything starts
    scenario = Path(scenario or DEFAULT_SCENARIO)
    work = Path(work or tempfile.mkdtemp(prefix="testbed-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    results = []
    for i in range(cycles):
        res = run_cycle(i, rng, scenario, work, window_s, kill=kill)
        results.append(res)
        told = "" if res.outcome is None else "; outcome " + "; ".join(
            f"{m}: {o['completed']}/{o['requests']} completed, {o['failed']} failed with a "
            f"reason" for m, o in res.outcome.items()) + (
            f"; PROBLEMS: {'; '.join(res.outcome_problems)}" if res.outcome_problems else "")
        print(f"chaos: cycle {i}: {res.target} at {res.at_s:g} s: killed "
              f"{res.killed or 'nothing (the run ended first)'}; runner exit {res.runner_exit}, "
              f"clean exit {res.clean_exit}; {len(res.leftovers)} leftovers{told}",
              file=sys.stderr)
    return {"seed": seed, "cycles": cycles, "kill": kill, "scenario": str(scenario),
            "work_dir": str(work), "window_s": window_s,
            "results": [vars(r) for r in results],
            "leftovers_total": sum(len(r.leftovers) for r in results),
            "outcome_problems_total": sum(len(r.outcome_problems) for r in results)}
