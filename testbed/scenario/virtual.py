"""``testbed run --clock virtual``: the same scenario, roles and report on a simulated clock.

Owns ``run_scenario_virtual`` (every mode, then the report), ``unsupported``
(what the network model cannot run, named before anything starts),
``network_for`` (a topology as a ``FluidNetwork``) and ``VirtualOps`` (the
fault kinds' operations on that network and the in-process roles).

Per mode, in one process and on one ``VirtualClockLoop`` (a fresh one per
mode, so a mode's clock starts at 0): the cluster config and workload are
written as the emulator writes them (``cluster.json``, ``workload.jsonl``;
instances are addressed by host name), the unchanged role classes start in
dependency order over ``FluidTransport``s (``testbed.pdd.run.cluster``),
the client replays the warm-up and then the workload, the faults'
timed actions run at their offsets from the workload's start (a fault on a
protocol event at the event's time plus its delay: the roles' events go to
``_EventSink``, not a file), ``links.csv``
gets a row per channel every ``SAMPLE_EVERY_S`` of simulated time, and at
the end the roles stop and every token is verified as on the emulator.
``metadata.json`` says ``clock: virtual``; the report reads the run
directory as it reads an emulated one. There is no fidelity verdict: no
host kept up or fell behind (the verdict is null and the report says
which clock ran).

Example::

    testbed run scenarios/quickstart.yaml --clock virtual --out runs/qs-virtual
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import sys
from pathlib import Path

from testbed import clock
from testbed.errors import EmulationError, SpecError
from testbed.impairment import NO_LOSS
from testbed.net.events import EventLog
from testbed.net.plan import select_channels
from testbed.pdd.wire.fluid_loss import MAX_MODELED_LOSS_PCT
from testbed.scenario.cluster_config import cluster_dict_for, workload_lines
from testbed.scenario.sampler import HEADER as LINKS_HEADER, SAMPLE_EVERY_S
from testbed.scenario.triggers import TriggeredFaults
from testbed.spec.faultkinds import kind
from testbed.spec.topology import Topology
from testbed.types import FaultEvent

# the fault kinds the network model carries (any other is refused by name)
SUPPORTED_FAULTS = ("bandwidth", "bandwidth_schedule", "rtt", "congestion", "kill", "restart",
                    "link_flap", "loss", "duplicate")


def unsupported(sc) -> list[str]:
    """Why the virtual clock cannot run ``sc`` faithfully (empty: it can), each reason
    naming the field and its value."""
    out = []
    topo = sc.topology
    links = [("wan.a_to_b", topo.wan.a_to_b), ("wan.b_to_a", topo.wan.b_to_a)]
    links += [(f"hosts.{h.name}.link", h.link) for h in topo.hosts]
    links += [(f"datacenters.{d.name}.host_link", d.host_link) for d in topo.datacenters]
    why_loss = (f"above {MAX_MODELED_LOSS_PCT:g}% the emulator's TCP (bbr) falls into "
                "retransmission-timeout chains and a collapsed bandwidth estimate that the loss "
                "model does not have (docs/virtual-clock.md)")
    for where, spec in links:
        if spec.loss.mean_pct > MAX_MODELED_LOSS_PCT:
            out.append(f"{where}.loss: {spec.loss.mean_pct:g}% mean; {why_loss}")
        if spec.reorder_pct > 0:
            out.append(f"{where}.reorder_pct: {spec.reorder_pct:g}; not modeled")
        if spec.jitter_ms > 0 and spec.jitter_distribution not in ("uniform", "normal"):
            out.append(f"{where}.jitter_distribution: {spec.jitter_distribution!r}; only "
                       "'uniform' and 'normal' are modeled")
    for f in sc.faults:
        if f.kind not in SUPPORTED_FAULTS:
            out.append(f"faults[{f.index}].kind: {f.kind!r}; not modeled")
        elif f.kind == "loss" and f.params["loss"].mean_pct > MAX_MODELED_LOSS_PCT:
            out.append(f"faults[{f.index}].loss: {f.params['loss'].mean_pct:.3g}% mean; "
                       f"{why_loss}")
    return out


def network_for(topo: Topology, scale: float, seed: int):
    """The topology's channels (host links up and down, gateway links, the WAN's two
    directions, each at nominal rate / ``scale``) and every host pair's path, as the
    emulated network routes it (testbed/net/plan.py)."""
    from testbed.pdd.wire.fluid_net import FluidNetwork

    net = FluidNetwork(seed)

    def chan(link: str, direction: str, spec):
        return net.channel(link, direction, spec.rate_gbit / scale, spec.delay_ms,
                           spec.jitter_ms, spec.jitter_distribution, spec.loss,
                           spec.duplicate_pct)

    hosts, gws = {}, {}
    for dc in topo.datacenters:
        gws[dc.name] = (chan(f"gw:{dc.name}", "up", dc.host_link),
                        chan(f"gw:{dc.name}", "down", dc.host_link))
        for h in dc.hosts:
            hosts[h.name] = (dc.name, chan(f"host:{h.name}", "up", h.link),
                             chan(f"host:{h.name}", "down", h.link))
    a, b = (d.name for d in topo.datacenters)
    wan = {(a, b): chan("wan", "a>b", topo.wan.a_to_b), (b, a): chan("wan", "b>a", topo.wan.b_to_a)}
    for src, (sdc, s_up, _) in hosts.items():
        for dst, (ddc, _, d_down) in hosts.items():
            if src == dst:
                continue
            if sdc == ddc:
                net.route(src, dst, [s_up, d_down])
            else:  # host up, its gateway's port (down: toward the gateway), the WAN,
                # the far gateway's port (up: from it), the host's port (down)
                net.route(src, dst, [s_up, gws[sdc][1], wan[(sdc, ddc)], gws[ddc][0], d_down])
    return net


def _plain(changes: dict) -> dict:
    """A link change as events.jsonl records it (a LossSpec as its fields, as the
    emulator's runtime writes it)."""
    return {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
            for k, v in changes.items()}


class _CrossFlows:
    """Cross traffic on a channel: bulk flows until ``stop``."""

    def __init__(self, ops: "VirtualOps", channel, flows: int, direction: str):
        self.ops, self.channel, self.flows = ops, channel, flows
        channel.set(clock.now(), bulk_flows=channel.bulk_flows + flows)
        ops.events.record("cross_traffic_start", n_flows=flows, direction=direction,
                          model="bulk fluid flows")

    def stop(self) -> None:
        self.channel.set(clock.now(), bulk_flows=max(0, self.channel.bulk_flows - self.flows))
        self.ops.events.record("cross_traffic_stop", n_flows=self.flows)


class VirtualOps:
    """The operations of ``testbed.spec.faultkinds.base.Ops`` on a ``FluidNetwork`` and an
    in-process cluster (``ClusterHandles``); link changes go to events.jsonl as the
    emulator's do (nominal and emulated values)."""

    def __init__(self, net, handles, events: EventLog, scale: float, link: str,
                 on_start=None):
        self.net, self.handles, self.events, self.scale = net, handles, events, scale
        self.on_start = on_start  # called with each restarted role (its events sink)
        self._orig = {c.id: {"rate_gbit": c.rate_gbit * scale, "delay_ms": c.delay_s * 1e3,
                             "jitter_ms": c.jitter_s * 1e3,
                             "loss": c.loss.spec if c.loss else NO_LOSS,
                             "duplicate_pct": c.duplicate_pct}
                      for c in select_channels(net.channels.values(), link)}
        self._tasks: set[asyncio.Task] = set()

    def set_link(self, link: str, **changes):
        chans = select_channels(self.net.channels.values(), link)
        for key in changes:
            if key not in ("rate_gbit", "delay_ms", "jitter_ms", "loss", "duplicate_pct"):
                raise EmulationError(f"virtual clock: set_link {key} is not modeled")
        for c in chans:
            rate = changes.get("rate_gbit")
            c.set(clock.now(), rate_gbit=None if rate is None else rate / self.scale,
                  delay_ms=changes.get("delay_ms"), jitter_ms=changes.get("jitter_ms"),
                  loss=changes.get("loss"), duplicate_pct=changes.get("duplicate_pct"))
            self.events.record("set_link", channel=c.id, **_plain(changes),
                               emulated_rate_gbit=c.rate_gbit, scale=self.scale)
        return chans

    def restore(self, link: str, *fields: str) -> None:
        for cid, values in self._orig.items():
            self.set_link(cid, **{k: values[k] for k in fields})

    def _link_state(self, link: str, up: bool) -> None:
        for c in select_channels(self.net.channels.values(), link):
            c.set(clock.now(), up=up)
        self.events.record("link_up" if up else "link_down", link=link,
                           ports=[c.id for c in select_channels(self.net.channels.values(),
                                                                link)])

    def link_down(self, link: str):
        self._link_state(link, False)

    def link_up(self, link: str):
        self._link_state(link, True)

    def cross_traffic(self, flows: int, direction: str):
        return _CrossFlows(self, self.net.channels[f"wan/{direction}"], flows, direction)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _name(self, what: str, role: str, instance: str | None) -> str:
        found = [i.name for i in self.handles.cfg.instances if i.role.name.lower() == role
                 and (instance is None or i.name == instance)]
        if not found:
            raise EmulationError(f"{what}: no {role} instance {instance or ''} in this mode")
        return found[0]

    def kill(self, role: str, instance: str | None):
        name = self._name("kill", role, instance)
        if name not in self.handles.roles:
            self.events.record("process_kill", role=role, name=name, already_dead=True)
            return
        self.events.record("process_kill", role=role, name=name)
        self._spawn(self.handles.kill(name))

    def restart(self, role: str, instance: str | None):
        name = self._name("restart", role, instance)
        if name in self.handles.roles:
            self.events.record("process_restart", role=role, name=name, already_up=True)
            return

        async def up():
            await self.handles.restart(name)
            if self.on_start is not None:
                self.on_start(self.handles.roles[name])
            self.events.record("process_restart", role=role, name=name)
        self._spawn(up())


class _EventSink:
    """The roles' protocol events (``RoleServer.protocol_event``), in memory: each role's
    ``events_out`` writes here instead of to a file, and every flushed event is handed
    to the triggered faults at once (``on_event``), so a fault on an event lands at the
    event's simulated time plus its delay. ``read`` is ``EventTail``'s interface."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._events: list[dict] = []
        self.on_event = None

    def attach(self, node) -> None:
        node.events_out = self

    def write(self, text: str) -> None:
        self._lines.append(text)

    def flush(self) -> None:
        lines, self._lines = "".join(self._lines).splitlines(), []
        self._events += [json.loads(x) for x in lines if x.strip()]
        if self.on_event is not None:
            self.on_event()

    def read(self) -> list[dict]:
        out, self._events = self._events, []
        return sorted(out, key=lambda ev: ev["t"])


class _VirtualLinks:
    """links.csv on the simulated clock: each channel's counters every SAMPLE_EVERY_S."""

    def __init__(self, net, path: Path, scale: float):
        self.net, self.scale = net, scale
        self._fh = path.open("w", newline="")
        self._w = csv.writer(self._fh)
        self._w.writerow(LINKS_HEADER)

    def sample(self) -> None:
        t = clock.now()
        for cid, c in self.net.channels.items():
            n = c.counted_bytes(t)
            self._w.writerow([f"{t:.6f}", c.link, c.direction, n, c.frames, 0,
                              f"{c.rate_gbit * self.scale:g}", f"{c.rate_gbit:g}", 0,
                              c.backlog_bytes])

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_EVERY_S)

    def close(self) -> None:
        self._fh.close()


async def _run_mode(sc, mode, workload, mode_dir: Path, scale: float, seed: int) -> None:
    from testbed.pdd.roles.client import Client, load_requests, warmup_problems, write_records
    from testbed.pdd.run.cluster import start_cluster
    from testbed.pdd.run.config import frame_limit, load_config
    from testbed.pdd.wire.fields import Role
    from testbed.scenario.runner import run_deadline_s

    cfg_dict = cluster_dict_for(sc.topology, scale, mode, {}, address=lambda h: h.name)
    (mode_dir / "roles").mkdir(parents=True, exist_ok=True)
    cfg_path = mode_dir / "cluster.json"
    cfg_path.write_text(json.dumps(cfg_dict, indent=1))
    wl_path = mode_dir / "workload.jsonl"
    wl_path.write_text("".join(json.dumps(x) + "\n" for x in workload_lines(workload)))
    cfg = load_config(cfg_path)
    requests = load_requests(wl_path)
    warm = [r for r in requests if r.warmup]
    measured = [r for r in requests if not r.warmup]
    net = network_for(sc.topology, scale, seed)
    net.max_frame_bytes = frame_limit(cfg)  # as a role process sets its TCP transport's
    events = EventLog(mode_dir / "events.jsonl")
    events.record("virtual_clock", model="fluid processor sharing, one bottleneck per path",
                  channels=len(net.channels))
    links = _VirtualLinks(net, mode_dir / "links.csv", scale)
    client_inst = cfg.of_role(Role.CLIENT)[0]
    handles = await start_cluster(cfg, lambda inst: net.host(inst.host))
    sink = _EventSink()
    for node in handles.roles.values():
        sink.attach(node)
    sampler = asyncio.get_running_loop().create_task(links.run())
    timers: list[asyncio.TimerHandle] = []
    try:
        if warm:
            records = await Client(cfg, net.host(client_inst.host), client_inst.name).run(warm)
            write_records(mode_dir / "warmup.jsonl", records)
            if problems := warmup_problems(records):
                raise EmulationError("warm-up failed: " + "; ".join(problems))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        started: set[int] = set()
        pending: dict[int, object] = {}

        def schedule(action) -> None:
            def fire():
                pending.pop(id(action), None)
                if action.starts is not None:
                    started.add(action.starts)
                more = action.run()
                for follow in more if isinstance(more, (list, tuple)) else ():
                    if hasattr(follow, "at_s") and hasattr(follow, "run"):
                        schedule(follow)
            pending[id(action)] = action
            timers.append(loop.call_at(t0 + action.at_s, fire))

        def actions(fault):
            ops = VirtualOps(net, handles, events, scale, fault.link, on_start=sink.attach)
            return [_logged(events, fault, a) if a.starts is not None or a.ends is not None
                    else a for a in kind(fault.kind).actions(fault, ops)]

        for fault in sc.faults:
            if fault.trigger is None:
                for a in actions(fault):
                    schedule(a)
        triggered = TriggeredFaults([(f, actions(f)) for f in sc.faults if f.trigger is not None],
                                    sink, events)
        sink.on_event = lambda: [schedule(a) for a in triggered.poll(t0)]
        events.record("workload_start", n_requests=len(measured))
        client = Client(cfg, net.host(client_inst.host), client_inst.name)
        deadline_s = run_deadline_s(sc, mode, workload.stats.span_s)
        timed_out = False
        try:
            records = await asyncio.wait_for(client.run(measured), deadline_s)
        except asyncio.TimeoutError:  # every request still ends, failed with the reason
            timed_out = True
            for trace in client.traces.values():
                if not trace.terminal:
                    trace.fail(f"the run's deadline passed ({deadline_s:g} s after the "
                               "workload's start: its arrivals, drain_s and a request timeout)")
            records = [t.record(cfg.mode.value, cfg.relay.handoff_mode.value)
                       for t in client.traces.values()]
        links.sample()
        triggered.untriggered()
        events.record("workload_end", client_exit=None if timed_out else 0, timed_out=timed_out)
        for h in timers:
            h.cancel()
        for action in sorted(pending.values(), key=lambda a: a.at_s):
            if action.ends in started:  # the workload finished first: end what started
                action.run()
        write_records(mode_dir / "requests.jsonl", records)
    finally:
        sampler.cancel()
        links.close()
        await handles.stop()
        events.close()


def _logged(events: EventLog, fault, action):
    import dataclasses

    params = {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
              for k, v in fault.params.items()}
    edge = "start" if action.starts is not None else "end"
    inner = action.run

    def run():
        events.record(**FaultEvent(edge, fault.index, fault.kind, fault.link,
                                   params).record())
        return inner()
    return dataclasses.replace(action, run=run)


def run_scenario_virtual(sc, opts) -> dict:
    """Run every mode of ``sc`` on the virtual clock into opts.out_dir and build the report
    (SpecError, before anything runs, when the model cannot carry the scenario)."""
    from testbed.net.build import auto_scale
    from testbed.net.shaping import Backend
    from testbed.pdd.run.vloop import VirtualClockLoop
    from testbed.report import build_report
    from testbed.scenario.metadata import write_metadata
    from testbed.scenario.runner import verify_mode
    from testbed.workload import build_workload

    if problems := unsupported(sc):
        raise SpecError(sc.file, problems[0].split(":", 1)[0], "only what the virtual clock "
                        "models (docs/virtual-clock.md)", "; ".join(problems))
    seed, scale, _ = sc.overridden(opts.seed, opts.scale, None)
    if scale is None:  # the k the emulator's userspace backend would choose, so both compare
        scale = auto_scale(sc.topology, Backend.USERSPACE)
    workload = build_workload(sc.workload, Path(sc.file).parent)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    meta = write_metadata(opts.out_dir, sc, "virtual", scale, seed, workload.stats)
    meta["clock"] = "virtual"
    meta["tie_seed"] = opts.tie_seed
    (opts.out_dir / "metadata.json").write_text(json.dumps(meta, indent=1, default=str))
    print(f"testbed: {sc.name}: {len(workload.requests)} requests, modes "
          f"{', '.join(m.value for m in sc.modes)}; virtual clock, k={scale:g}; "
          f"out {opts.out_dir}", file=sys.stderr)
    for mode in sc.modes:
        mode_dir = opts.out_dir / mode.value
        mode_dir.mkdir(parents=True, exist_ok=True)
        wl = build_workload(mode.workload, Path(sc.file).parent)
        tie_seed = opts.tie_seed
        with asyncio.Runner(loop_factory=lambda: VirtualClockLoop(tie_seed)) as runner:
            runner.run(_run_mode(sc, mode, wl, mode_dir, scale, seed))
            loop = runner.get_loop()
            print(f"[{mode.value}] finished at {loop.time():.1f} s simulated, "
                  f"{loop.jumps} clock jumps", file=sys.stderr)
        verify_mode(mode_dir)
    return build_report(opts.out_dir)
