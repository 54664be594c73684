"""Process entry point of one PDD role: ``python -m testbed.pdd.run.node CONFIG.json NAME``.

Loads the cluster config, finds instance NAME and runs its role on real TCP
(``TcpTransport``). A server role (prefill, relay_decode, main_decode,
router) prints ``ready`` on stdout once it listens (the router: once it has
also connected to every P, RLD and MD), then serves until SIGTERM or SIGINT,
stops cleanly (closes its listener and connections) and exits 0. A client
instance needs ``--workload FILE`` (JSONL: id, arrival_s, prompt, max_out,
session) and ``--out FILE`` (requests.jsonl); it prints ``ready``, replays
the workload, writes the records and exits 0. ``--stats FILE``: the process
appends its fidelity counters (pacer overruns, event-loop lag) to FILE
every second and at stop (testbed.pdd.run.probe).

Exit codes: 0 clean stop, 2 bad config or arguments (message on stderr),
1 a role failed to start or crashed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path

from testbed.errors import SpecError, TestbedError
from testbed.pdd.roles.client import Client, load_requests, warmup_problems, write_records
from testbed.pdd.run.cluster import ROLE_CLASSES
from testbed.pdd.run.config import ClusterConfig, frame_limit, load_config
from testbed.pdd.run.probe import RoleProbe, pacer_of
from testbed.pdd.run.sched import prefer_latency
from testbed.pdd.compute.engine import pin_threads
from testbed.pdd.wire.transport import TcpOptions, TcpTransport
from testbed.pdd.wire.fields import Role


def tcp_options(cfg: ClusterConfig) -> TcpOptions:
    """The TCP options of a role process: its config's ``limits`` section."""
    lim = cfg.limits
    return TcpOptions(max_frame_bytes=frame_limit(cfg),
                      max_bulk_payload_bytes=lim.max_kv_payload_bytes,
                      max_control_payload_bytes=lim.max_control_payload_bytes,
                      frame_timeout_s=lim.frame_timeout_s or None,
                      max_connections=lim.max_connections,
                      max_strangers=strangers_cap(cfg),
                      max_per_address=lim.max_connections_per_address)


def strangers_cap(cfg: ClusterConfig) -> int:
    """``limits.max_strangers``, its auto value resolved: room for 4 connections of each
    configured instance kept out of the strangers' reach."""
    lim = cfg.limits
    if lim.max_strangers:
        return min(lim.max_strangers, lim.max_connections)
    return max(1, lim.max_connections - 4 * len(cfg.instances))


def _probe(stats: str | None, cfg: ClusterConfig, name: str, node: object = None,
           sched: dict | None = None):
    """The role's fidelity probe writing to ``stats`` (started), or None without one."""
    if not stats:
        return None
    probe = RoleProbe(stats, name, cfg.instance(name).role.name.lower(), pacer_of(node),
                      sched=sched)
    probe.start()
    return probe


async def serve_role(cfg: ClusterConfig, name: str, stats: str | None = None,
                     sched: dict | None = None, events: str | None = None) -> None:
    """Run a server role until SIGTERM/SIGINT (``stats``: its RoleProbe's file; ``events``:
    where it appends its protocol events, ``RoleServer.protocol_event``)."""
    node = ROLE_CLASSES[cfg.instance(name).role](cfg, name, TcpTransport(tcp_options(cfg)))
    if events:
        node.events_out = open(events, "a")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    probe = None
    try:
        await node.start()
        probe = _probe(stats, cfg, name, node, sched)
        print("ready", flush=True)
        await stop.wait()
    finally:
        await node.stop()
        if probe is not None:
            await probe.stop()
        if node.events_out is not None:
            node.events_out.close()


async def run_client(cfg: ClusterConfig, name: str, workload: str, out: str,
                     stats: str | None = None, sched: dict | None = None) -> None:
    """Warm-up requests first (records in warmup.jsonl beside ``out``; any failure ends the
    client with exit 1 before "ready"), then "ready" and the measured replay."""
    requests = load_requests(workload)
    warm = [r for r in requests if r.warmup]
    requests = [r for r in requests if not r.warmup]
    if warm:
        records = await Client(cfg, TcpTransport(tcp_options(cfg)), name).run(warm)
        write_records(Path(out).with_name("warmup.jsonl"), records)
        if problems := warmup_problems(records):
            raise SystemExit("error: warm-up failed: " + "; ".join(problems))
    progress = open(out + ".progress", "w")  # one line per ended request, for a live status

    def on_end(request_id) -> None:
        progress.write(f"{request_id}\n")
        progress.flush()

    probe = _probe(stats, cfg, name, sched=sched)
    print("ready", flush=True)
    try:
        records = await Client(cfg, TcpTransport(tcp_options(cfg)), name, on_end).run(requests)
    finally:
        progress.close()
        if probe is not None:
            await probe.stop()
    write_records(out, records)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.pdd.run.node",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("config", help="cluster config JSON")
    ap.add_argument("name", help="this process's instance name")
    ap.add_argument("--workload", help="client: JSONL workload")
    ap.add_argument("--out", help="client: requests.jsonl to write")
    ap.add_argument("--stats", help="append the role's fidelity counters to this JSONL file "
                                    "(testbed.pdd.run.probe)")
    ap.add_argument("--events", help="server roles: append protocol events (handoff_sent, "
                                     "kv_transfer_half, ...) to this JSONL file")
    ap.add_argument("--log-level", default="WARNING")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config)
        role = cfg.instance(args.name).role
    except (TestbedError, KeyError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    pin_threads(cfg.model, 1)
    sched = prefer_latency(role)  # before any thread starts: they inherit the slice
    # What exists now (modules, config, torch) lives as long as the process: keep it out
    # of the collector's traversals, so that a full collection scans only the requests'
    # own objects (a full collection of the imported modules alone took ~14 ms here)
    gc.freeze()
    if role == Role.CLIENT:
        if not (args.workload and args.out):
            print("error: a client instance needs --workload and --out", file=sys.stderr)
            return 2
        try:
            asyncio.run(run_client(cfg, args.name, args.workload, args.out, args.stats,
                                   sched))
        except SpecError as err:  # a bad workload file
            print(f"error: {err}", file=sys.stderr)
            return 2
    else:
        asyncio.run(serve_role(cfg, args.name, args.stats, sched, args.events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
