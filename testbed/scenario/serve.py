"""``testbed serve`` and ``testbed exec``: a live PDD deployment for external clients.

``serve(topology, mode, opts)`` builds the emulated network, starts the PDD
roles of ``mode`` in their hosts (``roles.RoleSet``, as ``testbed run``
does) and the OpenAI-compatible gateway (``python -m testbed.pdd.roles.gateway``)
in the client host, registered with the network's registry like every
role. It writes ``serve.json`` into the output folder (URL, model, client
host, the run's prefix) next to ``cluster.json``, the roles' logs and the
gateway's ``requests.jsonl``, prints the URL and serves until Ctrl-C or
SIGTERM; then it stops everything, tears the network down, checks every
recorded request against the single-process greedy decode (``verify.json``)
and writes the gateway's figures (``gateway-stats.json``: TTFT p50/p90 as the
roles and as the HTTP side saw them, to set beside an external client's).

With a ``command`` (``testbed serve TOPOLOGY --mode M --out DIR -- COMMAND ...``)
serve runs that one client command in the client host once the gateway
answers (``testbed.pdd.run.client_command.client_argv`` fills in the
gateway's ``{url}`` and the rest; with ``mooncake_rows``, ``{trace}`` is a
slice of the shipped Mooncake trace scaled as client_bench scales it).
With a scenario (``testbed serve --scenario FILE``) the roles run with the
scenario's topology and ``pdd:`` settings for that mode, and ``{trace}`` is
its Mooncake workload as the scenario replays it (``write_client_trace``:
its rows, token scaling and arrival stretch), so an external client meets
the deployment and load of that scenario. Serve keeps its output in ``client.stdout`` / ``client.stderr``, stops when it
ends and records its exit code and argv in ``gateway-stats.json``: one
command from network up to verified records.

The URL is an address inside the emulated network (no host has a default
route), so a client runs in a host: ``testbed exec HOST -- COMMAND`` finds
the live run's namespace shell of HOST in the registry's state files
(``find_host_shell``: pid and start time checked, the run's owner alive)
and runs COMMAND in that host's network namespace (``mnexec -a PID``),
waiting for it and returning its exit code. While it runs, the command is
attached to the run's state file (``registry.attach_process``), so serve's
teardown and ``testbed clean`` stop it by pid; it leaves the file when it
ends.

Example::

    sudo testbed serve topologies/two-dc.yaml --mode pdd --out runs/live
    sudo testbed exec client -- .venv-bench/bin/aiperf profile --url http://10.0.0.5:8000 ...
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import EmulationError, TestbedError
from testbed.net import naming
from testbed.pdd.run.client_command import client_argv
from testbed.report.clients import agreement, client_ttft

GATEWAY_PORT = 8000


@dataclass(frozen=True)
class ServeOptions:
    out_dir: Path
    port: int = GATEWAY_PORT
    backend: str | None = None
    scale: float | None = None
    seed: int = 1
    ready_timeout_s: float = 60.0
    command: tuple[str, ...] = ()  # a client command to run in the client host, then stop
    mooncake_rows: int = 0  # {trace}: this many rows of the shipped Mooncake trace
    pdd: object = None  # PddSettings of the roles (a scenario's, with --scenario); None: defaults
    workload: object = None  # a scenario's WorkloadSpec: {trace} is its Mooncake workload
    workload_dir: Path = Path(".")  # the scenario's folder (its trace paths are relative to it)


def find_host_shell(records: list[dict], host: str, prefix: str | None = None,
                    alive=naming.process_alive, owner_alive=None) -> tuple[str, int]:
    """(prefix, pid) of the namespace shell of ``host`` in a live run's state file.

    ``records``: the state files' contents (registry.py). Runs whose owner is
    dead, and shells whose pid no longer has the recorded start time, are
    skipped; ``prefix`` picks one run when several are live. TestbedError
    when there is no such host, or it is ambiguous.
    """
    if owner_alive is None:
        from testbed.net.registry import owner_alive
    found = []
    for rec in records:
        if prefix is not None and rec.get("prefix") != prefix:
            continue
        if not owner_alive(rec):
            continue
        for proc in rec.get("processes", []):
            if proc.get("what") == f"shell of {host}" and alive(proc["pid"], proc.get("start")):
                found.append((rec["prefix"], proc["pid"]))
    if not found:
        where = f"run {prefix}" if prefix else "any live run"
        raise TestbedError(f"no host {host!r} in {where} (is `testbed serve` running?)")
    if len(found) > 1:
        raise TestbedError(f"host {host!r} is in several live runs "
                           f"({', '.join(p for p, _ in found)}): pick one with --prefix")
    return found[0]


def exec_argv(pid: int, command: list[str]) -> list[str]:
    """The command line that runs ``command`` in the network namespace of ``pid``."""
    if not command:
        raise TestbedError("exec: no command given (testbed exec HOST -- COMMAND ...)")
    return ["mnexec", "-a", str(pid), *command]


def read_state_files(state_dir: Path = naming.STATE_DIR) -> list[dict]:
    out = []
    for path in sorted(state_dir.glob("tb*.json")) if state_dir.is_dir() else []:
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # a run being written or gone: not a live host
    return out


def run_in_host(host: str, command: list[str], prefix: str | None = None) -> int:
    """``testbed exec``: run ``command`` in ``host`` of the live run; its exit code.

    The command (its process group) is attached to the run's state file while
    it runs, so the run's teardown and ``testbed clean`` stop it by pid.
    """
    from testbed.net.registry import attach_process, detach_process

    prefix, pid = find_host_shell(read_state_files(), host, prefix)
    argv = exec_argv(pid, command)
    proc = subprocess.Popen(argv, start_new_session=True)
    entry = None
    try:
        entry = attach_process(prefix, proc.pid, f"exec {shlex.join(command)} in {host}")
        return proc.wait()
    except KeyboardInterrupt:
        return _interrupt(proc)
    except BaseException:
        _interrupt(proc)  # e.g. the run ended before the command could be recorded
        raise
    finally:
        detach_process(prefix, entry)


def _interrupt(proc: subprocess.Popen, timeout_s: float = 10.0) -> int:
    """SIGINT to the command's process group, SIGKILL after ``timeout_s``; its exit code."""
    if proc.poll() is not None:
        return proc.returncode
    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def gateway_argv(config_path: Path, name: str, ip: str, port: int, out: Path,
                 stats: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "testbed.pdd.roles.gateway", str(config_path), name,
            "--host", ip, "--port", str(port), "--out", str(out), "--log-level", "INFO"] + (
        ["--stats", str(stats)] if stats is not None else [])


def serve_info(prefix: str, mode: str, client: dict, port: int, model: str) -> dict:
    """serve.json: where the live deployment answers."""
    return {"prefix": prefix, "mode": mode, "client_host": client["host_name"],
            "url": f"http://{client['host']}:{port}/v1", "model": model,
            "exec": f"testbed exec {client['host_name']} -- COMMAND"}


def serve(topo, mode, opts: ServeOptions) -> dict:
    """Network + roles + gateway up until Ctrl-C; then down; returns the verify result."""
    from testbed.net.apply import Terminated, raise_if_terminated
    from testbed.net.build import open_network
    from testbed.net.events import EventLog
    from testbed.net.shaping import Backend
    from testbed.pdd.roles.gateway import DEFAULT_MODEL
    from testbed.scenario.roles import RoleSet, _wait_ready, cluster_dict
    from testbed.scenario.runner import preflight, verify_mode
    from testbed.spec.scenario import ModeRun, PddSettings

    out = opts.out_dir
    out.mkdir(parents=True, exist_ok=True)
    events = EventLog(out / "events.jsonl")
    backend = Backend(opts.backend) if opts.backend else None
    with open_network(topo, backend, opts.scale, opts.seed, events) as net:
        preflight(net)
        run = ModeRun(mode.value, mode, opts.pdd or PddSettings(), None)
        roles = RoleSet(net, cluster_dict(net, run, {}), out, opts.ready_timeout_s)
        user = None  # (the client command's process, its argv)
        try:
            roles.start_servers()
            client = next(i for i in roles.cfg["instances"] if i["role"] == "client")
            host = roles._host_of(client)
            log = (roles.logs / f"{client['name']}.log").open("w")
            proc = net.popen(host, gateway_argv(roles.config_path, client["name"],
                                                client["host"], opts.port,
                                                roles.requests_path,
                                                roles.logs / f"{client['name']}.stats.jsonl"),
                             what=f"gateway {client['name']}", stdout=subprocess.PIPE,
                             stderr=log)
            log.close()
            roles.client = proc  # stopped first by roles.stop()
            _wait_ready(proc, client["name"], roles.logs / f"{client['name']}.log",
                        opts.ready_timeout_s)
            info = serve_info(net.plan.prefix, mode.value, dict(client, host_name=host),
                              opts.port, DEFAULT_MODEL)
            (out / "serve.json").write_text(json.dumps(info, indent=1) + "\n")
            print(f"testbed: serving {info['url']} (model {info['model']}, mode "
                  f"{mode.value}) in host {host}; run a client there with "
                  f"`{info['exec']}`; Ctrl-C stops", flush=True)
            if opts.command:
                user = _start_client(net, host, opts, out, client["host"], DEFAULT_MODEL)
            try:
                while proc.poll() is None:
                    raise_if_terminated()
                    if user is not None and user[0].poll() is not None:
                        break
                    time.sleep(0.2)
                else:
                    raise EmulationError(f"the gateway exited with {proc.returncode}; see "
                                         f"{roles.logs / (client['name'] + '.log')}")
            except (KeyboardInterrupt, Terminated):
                pass  # the way to stop serving
        finally:
            net.registry.stop_attached()  # `testbed exec` commands: clients go first
            if user is not None and user[0].poll() is None:
                _interrupt(user[0])
            roles.stop()
    events.close()
    result = verify_mode(out, gateway=True)
    stats = result.pop("gateway")
    if user is not None:
        stats.update(command=user[1], client_exit=user[0].returncode)
        theirs = client_ttft(out)  # the client's own TTFT figures, when it wrote known ones
        stats["client_ttft"] = theirs
        if theirs:
            stats.update(agreement(stats, theirs))
        (out / "gateway-stats.json").write_text(json.dumps(stats, indent=1) + "\n")
        result["client_exit"] = user[0].returncode
    return result


def _start_client(net, host: str, opts: ServeOptions, out: Path, ip: str,
                  model: str) -> tuple[subprocess.Popen, list[str]]:
    """Start the client command in ``host`` (registered like a role), output in out/."""
    from testbed.pdd.compute.text import TOKENIZER_DIR
    from testbed.workload.mooncake import (MOONCAKE_DIVISOR, MOONCAKE_TRACE, scale_trace,
                                         write_client_trace)

    trace = (out / "mooncake-slice.jsonl").resolve()
    block = 512 // MOONCAKE_DIVISOR
    if opts.mooncake_rows:
        scale_trace(MOONCAKE_TRACE, trace, opts.mooncake_rows)
    elif opts.workload is not None and opts.workload.mooncake is not None:
        write_client_trace(opts.workload, trace, opts.workload_dir)
        block = opts.workload.mooncake.scaled_block_tokens
    argv = client_argv(opts.command, ip, opts.port, out, model, TOKENIZER_DIR.resolve(), trace,
                       block)
    with open(out / "client.stdout", "wb") as so, open(out / "client.stderr", "wb") as se:
        proc = net.popen(host, argv, what="client command", stdout=so, stderr=se)
    print(f"testbed: running the client in {host}: {shlex.join(argv)}", flush=True)
    return proc, argv
