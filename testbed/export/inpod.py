"""What runs inside the exported pods: ``python -m testbed.export.inpod role|client|trigger``.

- ``role CONFIG NAME``: waits until the instance's own Service name
  resolves (a headless Service publishes the pod's IP, which the role binds
  to), then runs ``python -m testbed.pdd.run.node CONFIG NAME`` unchanged, as
  its child: SIGTERM/SIGINT are passed on, its exit code is ours, and once
  it prints ``ready`` (the router: after connecting to every P, RLD and
  MD) ``GET /ready`` on ``--health-port`` answers 200 (the pod's
  readinessProbe, and what the client waits for).
- ``client CONFIG NAME --workload FILE --results DIR``: the client Job.
  Lifecycle: serve HTTP on ``--port`` (``GET /ready``: 503, later 200;
  ``POST /start``: 200 once ready, starts the replay once); wait until
  every server role is ready (``--wait http``: its ``/ready``; ``tcp``: its
  port accepts, for roles started otherwise, e.g. on loopback); replay the warm-up requests (records
  in ``DIR/warmup.jsonl``); answer ready; on the Workflow's ``POST /start``
  replay the measured requests with the same client code the single
  machine runs (``testbed.pdd.run.node.run_client``) into
  ``DIR/requests.jsonl``; write ``DIR/client.json`` (the start and end on
  this pod's monotonic clock, which every time in requests.jsonl uses);
  stay up ``--linger-s`` so ``kubectl cp`` can copy DIR (``POST /exit``
  ends it sooner). Exit 0, or 1 when the warm-up or the replay failed.
- ``trigger --port P -- ARGV``: ``POST /start`` runs ARGV once (the
  Workflow starts an iperf3 client this way); exits with its exit code.
- ``exec -- ARGV``: becomes ARGV (the iperf3 server).

The image's ENTRYPOINT is this module (Containerfile), so pods pass only
``args`` (testbed.export.manifests says why).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RESOLVE_TIMEOUT_S = 300.0
ROLES_TIMEOUT_S = 1800.0
HEALTH_PORT = 8090


class Gate:
    """The state the HTTP handler exposes: ready (200 on /ready), start and exit events."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.start = threading.Event()
        self.exit = threading.Event()


def serve_gate(gate: Gate, port: int) -> ThreadingHTTPServer:
    """Serve /ready, /start and /exit on 0.0.0.0:port in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, ok: bool) -> None:
            body = b"ok\n" if ok else b"not ready\n"
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._answer(self.path == "/ready" and gate.ready.is_set())

        def do_POST(self) -> None:  # noqa: N802
            if self.path == "/start" and gate.ready.is_set():
                gate.start.set()
                return self._answer(True)
            if self.path == "/exit":
                gate.exit.set()
                return self._answer(True)
            self._answer(False)

        def log_message(self, fmt: str, *args) -> None:  # keep the pod log for the client
            pass

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_resolvable(host: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.getaddrinfo(host, None)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"error: {host} does not resolve after {timeout_s:g} s")
            time.sleep(1.0)


def wait_connectable(addresses: list[tuple[str, int]],
                     timeout_s: float = ROLES_TIMEOUT_S) -> None:
    """Until a TCP connection to every (host, port) succeeds."""
    _wait_each(addresses, lambda h, p: socket.create_connection((h, p), timeout=2.0).close(),
               timeout_s)


def wait_healthy(hosts: list[str], port: int = HEALTH_PORT,
                 timeout_s: float = ROLES_TIMEOUT_S) -> None:
    """Until ``GET http://host:port/ready`` answers 200 for every host."""
    def check(host: str, p: int) -> None:
        with urllib.request.urlopen(f"http://{host}:{p}/ready", timeout=2.0) as r:
            if r.status != 200:
                raise OSError(f"status {r.status}")

    _wait_each([(h, port) for h in hosts], check, timeout_s)


def _wait_each(targets, check, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for host, port in targets:
        while True:
            try:
                check(host, port)
                break
            except OSError:  # refused, unresolvable, 503 (urllib's HTTPError is an OSError)
                if time.monotonic() > deadline:
                    raise SystemExit(f"error: {host}:{port} not ready after {timeout_s:g} s")
                time.sleep(1.0)


def run_gated(argv: list[str], health_port: int) -> int:
    """Run ``argv``; ``/ready`` on ``health_port`` answers 200 once it prints ``ready``.
    SIGTERM and SIGINT are passed on; returns its exit code."""
    gate = Gate()
    serve_gate(gate, health_port)
    child = subprocess.Popen(argv, stdout=subprocess.PIPE)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _frame: child.send_signal(s))
    for line in child.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        if line.strip() == b"ready":
            gate.ready.set()
    return child.wait()


def cmd_role(args) -> int:
    from testbed.pdd.run.config import load_config

    wait_resolvable(load_config(args.config).instance(args.name).host)
    return run_gated([sys.executable, "-m", "testbed.pdd.run.node", args.config, args.name,
                      "--log-level", "INFO"], args.health_port)


def _split_workload(path: str, results: Path) -> tuple[Path | None, Path]:
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    warm = [ln for ln in lines if json.loads(ln).get("warmup")]
    measured = [ln for ln in lines if not json.loads(ln).get("warmup")]
    warm_path = results / "workload-warmup.jsonl" if warm else None
    if warm_path:
        warm_path.write_text("\n".join(warm) + "\n")
    measured_path = results / "workload.jsonl"
    measured_path.write_text("\n".join(measured) + ("\n" if measured else ""))
    return warm_path, measured_path


def cmd_client(args) -> int:
    from testbed.pdd.run.config import load_config
    from testbed.pdd.run.node import run_client
    from testbed.pdd.wire.fields import Role

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,  # as testbed.pdd.run.node does
                        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s")
    cfg = load_config(args.config)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    gate = Gate()
    serve_gate(gate, args.port)
    servers = [i for i in cfg.instances if i.role != Role.CLIENT]
    if args.wait == "http":
        wait_healthy([i.host for i in servers])
    else:
        wait_connectable([(i.host, i.port) for i in servers])
    warm, measured = _split_workload(args.workload, results)
    record = {"name": args.name, "t_roles_up_mono": time.monotonic()}
    code = 0
    try:
        if warm is not None:  # its records go to warmup.jsonl beside the out file
            asyncio.run(run_client(cfg, args.name, str(warm), str(results / "warmup-out.jsonl")))
        gate.ready.set()
        record["t_ready_mono"] = time.monotonic()
        gate.start.wait()
        record.update(t_start_mono=time.monotonic(), t_start_wall=time.time())
        asyncio.run(run_client(cfg, args.name, str(measured), str(results / "requests.jsonl")))
        record["t_end_mono"] = time.monotonic()
    except SystemExit as err:  # run_client's warm-up failure
        record["error"], code = str(err), 1
    (results / "client.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"client: done (exit {code}); results in {results}", file=sys.stderr, flush=True)
    gate.exit.wait(args.linger_s)
    return code


def cmd_trigger(args) -> int:
    gate = Gate()
    gate.ready.set()
    serve_gate(gate, args.port)
    gate.start.wait()
    return subprocess.run(args.argv, check=False).returncode


def cmd_exec(args) -> int:
    os.execvp(args.argv[0], args.argv)
    return 1  # not reached


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.export.inpod",
                                 description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("role")
    p.add_argument("config")
    p.add_argument("name")
    p.add_argument("--health-port", type=int, default=HEALTH_PORT)
    p.set_defaults(func=cmd_role)
    p = sub.add_parser("client")
    p.add_argument("config")
    p.add_argument("name")
    p.add_argument("--workload", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--linger-s", type=float, default=3600.0)
    p.add_argument("--wait", choices=("http", "tcp"), default="http",
                   help="how to tell the server roles are ready (see the module docstring)")
    p.set_defaults(func=cmd_client)
    p = sub.add_parser("trigger")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("argv", nargs="+")
    p.set_defaults(func=cmd_trigger)
    p = sub.add_parser("exec")
    p.add_argument("argv", nargs="+")
    p.set_defaults(func=cmd_exec)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
