"""The PDD roles of one mode, started inside the emulated hosts.

Owns the bridge between a scenario and ``testbed.pdd``: it writes the
cluster config (every role instance at its host's address, the mode, the
scenario's role settings, k and the WAN prior), writes the workload as
JSONL, starts one ``python -m testbed.pdd.run.node`` per role inside its host
(registered with the network's registry, so teardown and ``testbed clean``
stop them), waits for each ``ready``, then starts the client. It can kill a
role process (fault ``kill``) and stops everything at the end.

Role processes log to ``MODE/roles/NAME.log`` and append their fidelity
counters (pacer overruns, event-loop lag; testbed.pdd.run.probe) to
``MODE/roles/NAME.stats.jsonl``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.errors import EmulationError
from testbed.readyline import EXITED, TIMED_OUT, wait_ready
from testbed.net.registry import stop_process
from testbed.scenario.cluster_config import cluster_dict_for, workload_lines

READY_TIMEOUT_S = 60.0
_START_ORDER = ("prefill", "relay_decode", "main_decode", "router")


def cluster_dict(net, mode_run, settings) -> dict:
    """The cluster config (plain data, validated by testbed.pdd.run.config): every
    instance at its host's IP (``testbed.scenario.cluster_config``)."""
    return cluster_dict_for(net.plan.topology, net.plan.scale, mode_run, settings)


def write_workload(path: Path, workload) -> None:
    """The client's workload.jsonl: warm-up requests (``"warmup": true``), then the rest."""
    with path.open("w") as fh:
        for line in workload_lines(workload):
            fh.write(json.dumps(line) + "\n")


class RoleSet:
    def __init__(self, net, cfg: dict, mode_dir: Path, ready_timeout_s: float = READY_TIMEOUT_S):
        self.net, self.cfg, self.dir = net, cfg, mode_dir
        self.ready_timeout_s = ready_timeout_s
        self.logs = mode_dir / "roles"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.config_path = mode_dir / "cluster.json"
        self.config_path.write_text(json.dumps(cfg, indent=1))
        self.procs: dict[str, subprocess.Popen] = {}
        self.client: subprocess.Popen | None = None
        self.t0 = 0.0
        self.requests_path = mode_dir / "requests.jsonl"

    def _host_of(self, inst: dict) -> str:
        return next(h.name for h in self.net.plan.topology.hosts if h.ip == inst["host"])

    def _start(self, inst: dict, extra: list[str], log_mode: str = "w") -> subprocess.Popen:
        log = (self.logs / f"{inst['name']}.log").open(log_mode)
        stats = self.logs / f"{inst['name']}.stats.jsonl"
        events = self.logs / f"{inst['name']}.events.jsonl"  # protocol events (triggers)
        if log_mode == "w":  # a restart appends (a new pid), a new run starts afresh
            stats.unlink(missing_ok=True)
            events.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "testbed.pdd.run.node", str(self.config_path), inst["name"],
                "--log-level", "INFO", "--stats", str(stats), "--events", str(events)] + extra
        proc = self.net.popen(self._host_of(inst), argv, what=f"{inst['role']} {inst['name']}",
                              stdout=subprocess.PIPE, stderr=log)
        log.close()
        return proc

    def start_servers(self) -> None:
        for role in _START_ORDER:
            started = [(i["name"], self._start(i, [])) for i in self.cfg["instances"]
                       if i["role"] == role]
            for name, proc in started:
                _wait_ready(proc, name, self.logs / f"{name}.log", self.ready_timeout_s)
                self.procs[name] = proc

    def start_client(self, workload_path: Path, warmup_timeout_s: float = 0.0) -> None:
        """Start the client and wait for its "ready", which comes after its warm-up
        requests (if any): ``warmup_timeout_s`` more."""
        inst = next(i for i in self.cfg["instances"] if i["role"] == "client")
        self.client = self._start(inst, ["--workload", str(workload_path),
                                         "--out", str(self.requests_path)])
        _wait_ready(self.client, inst["name"], self.logs / f"{inst['name']}.log",
                    self.ready_timeout_s + warmup_timeout_s)
        self.t0 = time.monotonic()

    # -- the runner's view ---------------------------------------------
    def client_done(self) -> bool:
        return self.client is not None and self.client.poll() is not None

    def client_exit(self) -> int | None:
        return None if self.client is None else self.client.poll()

    def requests_done(self) -> int:
        """Requests ended so far (the client's progress file, one line each)."""
        try:
            with self.requests_path.with_name(self.requests_path.name + ".progress").open() as fh:
                return sum(1 for _ in fh)
        except OSError:
            return 0

    def _instance(self, what: str, role: str, instance: str | None) -> dict:
        found = [i for i in self.cfg["instances"] if i["role"] == role
                 and (instance is None or i["name"] == instance)]
        if not found:
            raise EmulationError(f"{what}: no {role} instance {instance or ''} in this mode")
        return found[0]

    def kill(self, role: str, instance: str | None) -> None:
        name = self._instance("kill", role, instance)["name"]
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            self.net.events.record("process_kill", role=role, name=name, already_dead=True)
            return
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=5)
        self.net.events.record("process_kill", role=role, name=name, pid=proc.pid)

    def restart(self, role: str, instance: str | None) -> None:
        """Start instance ``name`` again (after ``kill``): same config, empty caches."""
        inst = self._instance("restart", role, instance)
        name = inst["name"]
        old = self.procs.get(name)
        if old is not None and old.poll() is None:
            self.net.events.record("process_restart", role=role, name=name, already_up=True)
            return
        proc = self._start(inst, [], log_mode="a")
        self.procs[name] = proc  # registered before the wait: stop() ends it either way
        _wait_ready(proc, name, self.logs / f"{name}.log", self.ready_timeout_s)
        self.net.events.record("process_restart", role=role, name=name, pid=proc.pid)

    def stop(self) -> None:
        for proc in ([self.client] if self.client else []) + list(self.procs.values())[::-1]:
            if proc.poll() is None:
                stop_process(proc.pid, None, timeout_s=5.0)


def _wait_ready(proc: subprocess.Popen, name: str, log: Path,
                timeout_s: float = READY_TIMEOUT_S) -> None:
    outcome = wait_ready(proc, timeout_s, poll_s=0.2)
    if outcome == EXITED:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass  # closed its stdout but still runs: the exit code is None
        tail = log.read_text()[-1500:] if log.exists() else ""
        raise EmulationError(f"role {name} exited with {proc.returncode} before ready:\n{tail}")
    if outcome == TIMED_OUT:
        raise EmulationError(f"role {name} not ready after {timeout_s:g} s (log {log})")


def start_roles(net, sc, mode_run, workload, mode_dir: Path,
                ready_timeout_s: float = READY_TIMEOUT_S) -> RoleSet:
    """Start every role of ``mode_run`` in its host, then the client (t0 = its start)."""
    roles = RoleSet(net, cluster_dict(net, mode_run, {}), mode_dir, ready_timeout_s)
    try:
        wl = mode_dir / "workload.jsonl"
        write_workload(wl, workload)
        roles.start_servers()
        roles.start_client(wl, 2 * mode_run.pdd.request_timeout_s if workload.warmup else 0.0)
    except BaseException:
        roles.stop()
        raise
    return roles
