"""Run each PDD role as its own OS process on loopback: for tests and local runs.

Owns ``loopback_config`` (a copy of a config with every instance on
127.0.0.1 and a free port) and ``RoleProcesses``, which starts
``python -m testbed.pdd.run.node CONFIG NAME`` per instance in dependency order
(P, RLD, MD, router), each in its own session, waits for its ``ready``
line, and stops them by process group: SIGTERM, wait, SIGKILL, reap.
Every start is undone by ``stop()`` (idempotent; also on context exit).
Each process's stderr goes to ``<run_dir>/<name>.log``.

Example::

    cfg = loopback_config(cfg)
    with RoleProcesses(cfg, run_dir) as procs:
        procs.start()
        procs.run_client("client", workload_path, run_dir / "requests.jsonl")
        procs.start_gateway("client", 8000, run_dir / "gateway.jsonl")  # OpenAI API
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from testbed.errors import TestbedError
from testbed.readyline import READY, wait_ready
from testbed.pdd.run.cluster import START_ORDER
from testbed.pdd.run.config import ClusterConfig, config_to_dict
from testbed.pdd.wire.fields import Role


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_config(cfg: ClusterConfig) -> ClusterConfig:
    """``cfg`` with every instance on 127.0.0.1 and a fresh free port (clients: 0)."""
    insts = tuple(dataclasses.replace(i, host="127.0.0.1",
                                      port=0 if i.role == Role.CLIENT else free_port())
                  for i in cfg.instances)
    return dataclasses.replace(cfg, instances=insts)


class RoleProcesses:
    """The role processes of one cluster (see the module docstring)."""

    def __init__(self, cfg: ClusterConfig, run_dir: str | Path, ready_timeout_s: float = 60.0,
                 events: bool = False):
        """``events``: each server role appends its protocol events to
        ``<run_dir>/<name>.events.jsonl``."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.events = events
        self.ready_timeout_s = ready_timeout_s
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.run_dir / "cluster.json"
        self.config_path.write_text(json.dumps(config_to_dict(cfg), indent=1))
        self.procs: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> RoleProcesses:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _argv(self, name: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "testbed.pdd.run.node", str(self.config_path), name, *extra]

    def start(self) -> None:
        """Start every server role and wait for each one's ``ready``.

        P, RLD and MD start together (they connect to each other lazily, with
        retries); the router starts once they are ready, since it connects to
        all of them before it prints ``ready``.
        """
        first = [i.name for role in START_ORDER[:-1] for i in self.cfg.of_role(role)]
        for name in first:
            self._spawn(name)
        for name in first:
            self._wait_ready(name, self.procs[name])
        for inst in self.cfg.of_role(Role.ROUTER):
            self.start_one(inst.name)

    def start_one(self, name: str) -> subprocess.Popen:
        """Start one server role and wait for its ``ready``."""
        proc = self._spawn(name)
        self._wait_ready(name, proc)
        return proc

    def _spawn(self, name: str) -> subprocess.Popen:
        extra = ("--events", str(self.run_dir / f"{name}.events.jsonl")) if self.events else ()
        with open(self.run_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(self._argv(name, *extra), stdout=subprocess.PIPE, stderr=log,
                                    start_new_session=True)
        self.procs[name] = proc
        return proc

    def _wait_ready(self, name: str, proc: subprocess.Popen) -> None:
        if wait_ready(proc, self.ready_timeout_s) == READY:
            return
        raise TestbedError(f"{name} did not print 'ready' (exit {proc.poll()}); see "
                           f"{self.run_dir / (name + '.log')}")

    def start_gateway(self, name: str, http_port: int, out: str | Path,
                      *extra: str) -> subprocess.Popen:
        """Start the OpenAI-compatible gateway as client instance ``name``
        (``python -m testbed.pdd.roles.gateway``) on 127.0.0.1:``http_port`` and wait for its
        ``ready``; ``stop()`` ends it like the roles."""
        argv = [sys.executable, "-m", "testbed.pdd.roles.gateway", str(self.config_path), name,
                "--host", "127.0.0.1", "--port", str(http_port), "--out", str(out), *extra]
        with open(self.run_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log,
                                    start_new_session=True)
        self.procs[name] = proc
        self._wait_ready(name, proc)
        return proc

    def run_client(self, name: str, workload: str | Path, out: str | Path,
                   timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        """Run a client instance to completion (it writes ``out``)."""
        with open(self.run_dir / f"{name}.log", "ab") as log:
            return subprocess.run(self._argv(name, "--workload", str(workload), "--out", str(out)),
                                  stdout=subprocess.DEVNULL, stderr=log, timeout=timeout_s,
                                  start_new_session=True, check=False)

    def signal(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one role's process group (e.g. to crash it)."""
        os.killpg(self.procs[name].pid, sig)

    def stop(self, timeout_s: float = 10.0) -> dict[str, int | None]:
        """SIGTERM every role (reverse start order), wait, SIGKILL leftovers; return exit codes."""
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        codes = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[name] = proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs.clear()
        return codes
