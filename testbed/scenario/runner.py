"""``testbed run``: one scenario, every mode on a fresh network, one report.

Owns the run's lifecycle. For each mode: build the network (same topology,
backend, k and seed for every mode), start the PDD roles in their hosts,
start the client (which replays the identical workload), drive the fault
timeline, sample the links, wait for the client to finish or the deadline,
stop the roles and tear the network down (always: finally, SIGINT,
SIGTERM). Then the report package turns the run directory into
summary.json, report.md and plots.

The core loop is small (vidur's simulator): pop the next timed action,
run it; in between, sample links and refresh the status line.
"""

from __future__ import annotations

import heapq
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import EmulationError
from testbed.net.build import make_plan
from testbed.net.apply import EmulatedNetwork, raise_if_terminated
from testbed.net.backend import probe_backend
from testbed.net.calibrate import parse_ping
from testbed.net.events import EventLog
from testbed.scenario.faults import Action, actions_for
from testbed.scenario.triggers import POLL_S, EventTail, TriggeredFaults
from testbed.scenario.metadata import write_metadata
from testbed.scenario.policies import check_policies
from testbed.scenario.sampler import SAMPLE_EVERY_S, LinkSampler, RttProbe
from testbed.scenario.status import Status
from testbed.spec.scenario import ModeRun, Scenario, with_engine
from testbed.spec.topology import Role

PREFLIGHT_RTT_TOL_MS = 3.0


@dataclass(frozen=True)
class RunOptions:
    out_dir: Path
    seed: int | None = None
    scale: float | None = None
    backend: str | None = None
    dry_run: bool = False
    ready_timeout_s: float = 60.0  # per role start; a software-emulated guest needs minutes
    preflight_tol_ms: float = PREFLIGHT_RTT_TOL_MS  # a qemu guest adds ~5 ms per round trip
    pcap: bool = False  # keep a bounded WAN capture per mode, MODE/wan.pcap (capture.py)
    engine: str | None = None  # every mode's compute engine (torch | hash); None: the scenario's
    clock: str | None = None  # emulated | virtual (testbed/scenario/virtual.py); None: the scenario's
    tie_seed: int = 0  # virtual clock: the draw that breaks ties between simultaneous timers


def run_timeline(actions: list[Action], t0: float, until, tick, triggered=None) -> None:
    """Run actions at t0 + at_s until ``until()`` is true; ``tick()`` in between;
    ``triggered`` (``TriggeredFaults``): more actions once their event fires."""
    seq = itertools.count()
    heap = [(a.at_s, next(seq), a) for a in actions]
    heapq.heapify(heap)
    next_tick = time.monotonic()
    started: set[int] = set()
    while not until():
        if triggered is not None and triggered.pending:
            for a in triggered.poll(t0):
                heapq.heappush(heap, (a.at_s, next(seq), a))
        now = time.monotonic()
        if heap and t0 + heap[0][0] <= now:
            _, _, action = heapq.heappop(heap)
            if action.starts is not None:
                started.add(action.starts)
            more = action.run()
            for follow in more if isinstance(more, (list, tuple)) else ():
                if isinstance(follow, Action):
                    heapq.heappush(heap, (follow.at_s, next(seq), follow))
            continue
        if now >= next_tick:
            tick()
            next_tick = now + SAMPLE_EVERY_S
        wake = min([next_tick] + ([t0 + heap[0][0]] if heap else []))
        longest = POLL_S if triggered is not None and triggered.pending else 0.1
        time.sleep(max(0.0, min(wake - time.monotonic(), longest)))
    for _, _, action in sorted(heap, key=lambda e: (e[0], e[1])):
        if action.ends in started:  # the workload finished first: end what started
            action.run()


def probe_hosts(topo) -> tuple[str, str]:
    """The hosts an RTT probe runs between: the client's (DC A) and MD's (DC B)."""
    a, b = topo.datacenters
    src = next((h.name for h in a.hosts if Role.CLIENT in h.roles), a.hosts[0].name)
    dst = next((h.name for h in b.hosts if Role.MAIN_DECODE in h.roles), b.hosts[0].name)
    return src, dst


def preflight(net, tol_ms: float = PREFLIGHT_RTT_TOL_MS) -> dict:
    """The WAN delivers its configured RTT before any workload (else exit 2)."""
    topo = net.plan.topology
    src, dst = probe_hosts(topo)
    net.run(src, ["ping", "-c", "2", "-i", "0.2", "-W", "2", net.ip(dst)], timeout=20)
    r = net.run(src, ["ping", "-q", "-c", "20", "-i", "0.02", "-W", "2", net.ip(dst)], timeout=30)
    ping = parse_ping(r.stdout)
    want = topo.wan.rtt_ms
    jitter = topo.wan.a_to_b.jitter_ms + topo.wan.b_to_a.jitter_ms
    ok = ping["received"] > 0 and abs(ping["avg_ms"] - want) <= tol_ms + jitter
    net.events.record("preflight", rtt_configured_ms=want, rtt_measured_ms=ping["avg_ms"],
                      tolerance_ms=tol_ms + jitter, passed=ok)
    if not ok:
        raise EmulationError(f"the WAN does not deliver its RTT: configured {want} ms, "
                             f"measured {ping['avg_ms']} ms ({ping['received']}/20 replies)")
    return ping


def run_deadline_s(sc: Scenario, mode: ModeRun, span_s: float) -> float:
    """How long after the roles start a mode may run: its arrivals, the drain, and one
    request timeout of that mode (a variant may set its own ``request_timeout_s``)."""
    return span_s + sc.drain_s + mode.pdd.request_timeout_s


def run_mode(sc: Scenario, mode: ModeRun, plan_args: dict, out: Path,
             ready_timeout_s: float, preflight_tol_ms: float, pcap: bool = False) -> None:
    from contextlib import nullcontext

    from testbed.scenario.capture import WanCapture
    from testbed.scenario.roles import start_roles
    from testbed.workload import build_workload

    workload = build_workload(mode.workload, Path(sc.file).parent)
    mode_dir = out / mode.value
    mode_dir.mkdir(parents=True, exist_ok=True)
    events = EventLog(mode_dir / "events.jsonl")
    plan = make_plan(sc.topology, **plan_args)
    with EmulatedNetwork(plan, events) as net:
        preflight(net, preflight_tol_ms)
        sampler = LinkSampler(net, mode_dir / "links.csv")
        roles = rtt = None
        capture = WanCapture(net, mode_dir / "wan.pcap") if pcap else nullcontext()
        try:
            capture.__enter__()
            roles = start_roles(net, sc, mode, workload, mode_dir, ready_timeout_s)
            rtt = RttProbe(net, *probe_hosts(net.plan.topology), mode_dir / "ping.txt")
            actions = [a for fault in sc.faults if fault.trigger is None
                       for a in actions_for(fault, net, roles)]
            triggered = TriggeredFaults([(f, actions_for(f, net, roles)) for f in sc.faults
                                         if f.trigger is not None], EventTail(roles.logs), events)
            status = Status(mode.value, workload, roles, sampler, sc.faults)
            deadline = roles.t0 + run_deadline_s(sc, mode, workload.stats.span_s)
            events.record("workload_start", n_requests=len(workload.requests))

            def tick():
                raise_if_terminated()
                sampler.sample()
                status.show(time.monotonic() - roles.t0)

            run_timeline(actions, roles.t0, lambda: roles.client_done() or
                         time.monotonic() > deadline, tick, triggered)
            triggered.untriggered()
            sampler.sample()
            events.record("workload_end", client_exit=roles.client_exit(),
                          timed_out=not roles.client_done())
            status.finish()
        finally:
            if rtt is not None:
                rtt.close()
            capture.__exit__(None, None, None)
            sampler.close()
            if roles is not None:
                roles.stop()
    events.close()
    verify_mode(mode_dir)


def verify_mode(mode_dir: Path, gateway: bool = False) -> dict:
    """Every request's tokens vs a plain single-process greedy decode of its
    prompt (after the network is down, so it does not steal the run's CPU);
    ``gateway``: also the gateway's figures (``gateway-stats.json``, what an external
    client's TTFT is compared with), returned under ``gateway`` too."""
    from testbed.pdd.run.config import load_config
    from testbed.pdd.run.verify import gateway_stats, verify_records

    path = mode_dir / "requests.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] \
        if path.exists() else []
    verdicts = verify_records(records, load_config(mode_dir / "cluster.json").model)
    out = {"checked": len(verdicts),
           "mismatched": [v.id for v in verdicts if not v.prefix_ok
                          or (v.status == "completed" and not v.match)]}
    (mode_dir / "verify.json").write_text(json.dumps(out))
    if gateway:
        stats = gateway_stats(records, verdicts)
        (mode_dir / "gateway-stats.json").write_text(json.dumps(stats, indent=1) + "\n")
        return dict(out, gateway=stats)
    return out


def run_scenario(sc: Scenario, opts: RunOptions) -> dict:
    """Run every mode of ``sc`` into opts.out_dir and build the report."""
    from testbed.net.shaping import Backend
    from testbed.report import build_report
    from testbed.workload import build_workload

    if opts.engine is not None:
        sc = with_engine(sc, opts.engine)
    if problems := check_policies(sc):  # before any network exists
        raise problems[0]
    if (opts.clock or sc.clock) == "virtual":
        from testbed.scenario.virtual import run_scenario_virtual
        return run_scenario_virtual(sc, opts)
    seed, scale, backend_name = sc.overridden(opts.seed, opts.scale, opts.backend)
    backend, _ = probe_backend(None if backend_name == "auto" else Backend(backend_name))
    plan_args = {"backend": backend, "scale": scale, "seed": seed}
    scale = make_plan(sc.topology, **plan_args).scale
    plan_args["scale"] = scale
    workload = build_workload(sc.workload, Path(sc.file).parent)  # the shared one, for metadata
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    write_metadata(opts.out_dir, sc, backend.value, scale, seed, workload.stats)
    print(f"testbed: {sc.name}: {len(workload.requests)} requests, modes "
          f"{', '.join(m.value for m in sc.modes)}; backend {backend.value}, k={scale:g}; "
          f"out {opts.out_dir}", file=sys.stderr)
    for mode in sc.modes:
        run_mode(sc, mode, plan_args, opts.out_dir, opts.ready_timeout_s, opts.preflight_tol_ms,
                 opts.pcap)
    return build_report(opts.out_dir)
