"""Carry out a NetworkPlan: Mininet nodes, pyroute2 links/qdiscs, delay lines.

Owns the live emulated network of one run. ``EmulatedNetwork`` is a context
manager: entering builds every step of the plan in order, registering each
created object's undo in the Registry (and so in the run's state file);
leaving tears everything down in reverse - on normal exit, on exceptions
(also in the middle of the build), on SIGINT and on SIGTERM. After a SIGKILL
of the testbed, ``testbed clean`` finishes the job from the state file.

Hosts are Mininet ``Host`` objects (anonymous namespaces held by a shell
started with mnexec); DC switches are Mininet ``LinuxBridge``s without a
controller. Links, addresses, routes and qdiscs are set with pyroute2 in
the node's namespace (``/proc/PID/ns/net``), never with TCLink.

Example::

    with EmulatedNetwork(plan, EventLog(path)) as net:
        net.popen("client", ["ping", "-c1", net.ip("md1")], what="ping")
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

from testbed.errors import ApplyError, EmulationError
from testbed.readyline import EXITED, TIMED_OUT, wait_ready
from testbed.net import naming, plan as P, tc
from testbed.net.events import EventLog
from testbed.net.registry import Registry
from testbed.net.shaping import Backend

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 10.0


class Terminated(Exception):
    """Raised in the main thread on SIGTERM/SIGHUP so teardown runs."""


_pending_signal: list[int] = []  # a SIGTERM/SIGHUP whose Terminated may have been swallowed


def _terminate_handler(owner_pid: int):
    """SIGTERM/SIGHUP -> Terminated in the owner; plain exit in forked children
    (pyroute2 forks helpers that inherit the handler). The signal is also
    remembered: raised inside a library's event loop (pyroute2 runs asyncio),
    the exception can be caught and logged there, so the runner's loop calls
    ``raise_if_terminated`` (measured: the first SIGTERM to a suite was lost)."""
    def handler(signum, _frame):
        if os.getpid() != owner_pid:
            os._exit(128 + signum)
        _pending_signal.append(signum)
        raise Terminated(f"signal {signum}")
    return handler


def raise_if_terminated() -> None:
    """Raise Terminated if a SIGTERM/SIGHUP arrived and its exception may have been lost."""
    if _pending_signal:
        signum = _pending_signal.pop()
        _pending_signal.clear()
        raise Terminated(f"signal {signum}")


class EmulatedNetwork:
    def __init__(self, plan: P.NetworkPlan, events: EventLog | None = None):
        self.plan = plan
        self.events = events or EventLog()
        self.registry = Registry(plan.prefix)
        self.nodes: dict = {}       # name -> mininet Node
        self._iprs: dict = {}       # node name or None -> IPRoute
        self.delay_lines: dict = {}  # channel id -> control socket path
        self.channels = {c.id: c for c in plan.channels}  # current (changed at runtime)
        self._old_handlers: dict = {}
        self.built = False

    # -- lifecycle ----------------------------------------------------
    def __enter__(self) -> "EmulatedNetwork":
        handler = _terminate_handler(os.getpid())
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, handler)
        try:
            self.build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def build(self) -> None:
        t0 = time.monotonic()
        self.registry.open()
        sock_dir = naming.socket_dir(self.plan.prefix)
        sock_dir.mkdir(parents=True, exist_ok=True)
        self.registry.add_path(sock_dir)
        for step in self.plan.steps:
            handler = getattr(self, "_" + type(step).__name__)
            handler(step)
        self.built = True
        self.events.record("network_up", prefix=self.plan.prefix,
                           backend=self.plan.backend.value, scale=self.plan.scale,
                           build_s=round(time.monotonic() - t0, 3))

    def teardown(self) -> list[str]:
        failures = []
        if self.registry.undos or naming.state_file(self.plan.prefix).exists():
            for ipr in self._iprs.values():
                ipr.close()
            self._iprs.clear()
            failures = self.registry.teardown()
            self.events.record("network_down", prefix=self.plan.prefix, failures=failures)
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()
        _pending_signal.clear()  # handled: the network is down
        return failures

    # -- access -------------------------------------------------------
    def node(self, name: str):
        return self.nodes[name]

    def ip(self, host: str) -> str:
        return self.plan.addresses[host]

    def ipr(self, node: str | None):
        """pyroute2 IPRoute bound to a node's namespace (None: root)."""
        if node not in self._iprs:
            from pyroute2 import IPRoute

            if node is None:
                self._iprs[node] = IPRoute()
            else:
                self._iprs[node] = IPRoute(netns=f"/proc/{self.nodes[node].pid}/ns/net")
        return self._iprs[node]

    def ifindex(self, node: str | None, dev: str) -> int:
        found = self.ipr(node).link_lookup(ifname=dev)
        if not found:
            raise ApplyError(f"lookup {dev} in {node or 'root'}", "no such interface")
        return found[0]

    def popen(self, node: str, args: list[str], what: str, **kwargs) -> subprocess.Popen:
        """Start a process inside ``node`` in its own session, registered for cleanup."""
        kwargs.setdefault("stdout", subprocess.DEVNULL)
        kwargs.setdefault("stderr", subprocess.PIPE)
        proc = self.nodes[node].popen(args, **kwargs)
        self.registry.add_process(proc.pid, f"{what} in {node}")
        return proc

    def run(self, node: str, args: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run a command to completion inside ``node`` (not registered: waited for)."""
        cmd = ["mnexec", "-a", str(self.nodes[node].pid)] + args
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    # -- steps --------------------------------------------------------
    def _AddNode(self, step: P.AddNode) -> None:
        from mininet.node import Host

        host = Host(step.name, inNamespace=True)
        self.registry.add_process(host.shell.pid, f"shell of {step.name}",
                                  undo=lambda: self._stop_host(host))
        self.nodes[step.name] = host
        ipr = self.ipr(step.name)
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")

    @staticmethod
    def _stop_host(host) -> None:
        from testbed.net.registry import stop_process

        # the namespace's shell holds no state: kill it outright
        stop_process(host.shell.pid, None, first=signal.SIGKILL)
        host.shell = None
        # and close the pty Mininet opened for it (its Node.cleanup does the same): left
        # open, two descriptors per host per mode added up in one testbed suite until a
        # descriptor past 1024 broke select() at the 19th scenario
        for close in (host.stdin.close, lambda: os.close(host.slave)):
            try:
                close()
            except OSError:
                pass

    def _AddSwitch(self, step: P.AddSwitch) -> None:
        ipr = self.ipr(None)
        try:
            ipr.link("add", ifname=step.name, kind="bridge")
        except Exception as e:
            raise ApplyError(step, e) from e
        self.registry.add_root_link(step.name)
        ipr.link("set", index=self.ifindex(None, step.name), state="up")
        self.nodes[step.name] = None  # bridges live in the root namespace

    def _AddLink(self, step: P.AddLink) -> None:
        from mininet.util import makeIntfPair

        n1 = self.nodes[step.node1]
        n2 = self.nodes.get(step.node2)
        try:
            makeIntfPair(step.intf1, step.intf2, node1=n1, node2=n2, deleteIntfs=False)
        except Exception as e:
            raise ApplyError(step, e) from e
        if n2 is None:  # switch port in the root namespace
            self.registry.add_root_link(step.intf2)
            ipr = self.ipr(None)
            idx = self.ifindex(None, step.intf2)
            ipr.link("set", index=idx, master=self.ifindex(None, step.node2), state="up")
        else:
            self._up(step.node2, step.intf2)
        self._up(step.node1, step.intf1)

    def _up(self, node: str | None, dev: str) -> None:
        self.ipr(node).link("set", index=self.ifindex(node, dev), state="up")

    def _SetAddress(self, step: P.SetAddress) -> None:
        addr, plen = step.cidr.split("/")
        try:
            self.ipr(step.node).addr("add", index=self.ifindex(step.node, step.dev),
                                     address=addr, prefixlen=int(plen))
        except Exception as e:
            raise ApplyError(step, e) from e

    def _SetSysctls(self, step: P.SetSysctls) -> None:
        args = [f"{k}={v}" for k, v in step.values]
        # -e: keys a kernel keeps only in the initial namespace (net.core.rmem_max
        # on 6.1) are skipped; the per-namespace tcp_rmem/tcp_wmem still apply.
        r = self.run(step.node, ["sysctl", "-e", "-qw"] + args, timeout=10)
        if r.returncode != 0:
            raise ApplyError(step, r.stderr.strip() or f"exit {r.returncode}")

    def _AddRoute(self, step: P.AddRoute) -> None:
        try:
            self.ipr(step.node).route("add", dst=step.dst, gateway=step.via)
        except Exception as e:
            raise ApplyError(step, e) from e

    def _BridgePorts(self, step: P.BridgePorts) -> None:
        ipr = self.ipr(step.node)
        ipr.link("add", ifname=step.bridge, kind="bridge")
        br = self.ifindex(step.node, step.bridge)
        for port in step.ports:
            ipr.link("set", index=self.ifindex(step.node, port), master=br)
        ipr.link("set", index=br, state="up")

    def _RawPorts(self, step: P.RawPorts) -> None:
        ipr = self.ipr(step.node)
        for port in step.ports:
            ipr.link("set", index=self.ifindex(step.node, port), state="up", promiscuity=1)
            # no offload surprises: keep GSO (the delay line passes vnet headers)

    def _Shape(self, step: P.Shape) -> None:
        ch = step.channel
        tc.shape(self.ipr(ch.node), self.ifindex(ch.node, ch.dev), ch,
                 netem=self.plan.backend is Backend.NETEM)
        self.events.record("shape", channel=ch.id, dev=ch.dev, node=ch.node,
                           **_channel_fields(ch, self.plan.scale))

    def _StartDelayLine(self, step: P.StartDelayLine) -> None:
        from testbed.net.encoders import delay_params

        ch = step.channel
        sock = naming.socket_dir(self.plan.prefix) / f"dl-{ch.direction.replace('>', '')}.sock"
        params = delay_params(ch.impairment, up=True)
        args = [sys.executable, "-m", "testbed.net.delayline", "--in", ch.delay_line[0],
                "--out", ch.delay_line[1], "--control", str(sock), "--params", params.to_json()]
        proc = self.popen(naming.WAN_NODE, args, what=f"delay line {ch.id}",
                          stdout=subprocess.PIPE)
        _wait_ready(proc, f"delay line {ch.id}")
        self.delay_lines[ch.id] = sock


def wait_listening(net: EmulatedNetwork, node: str, port: int, timeout_s: float = 5.0) -> None:
    """Wait until a TCP server listens on ``port`` inside ``node``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if net.run(node, ["ss", "-ltnH", f"sport = :{port}"], timeout=5).stdout.strip():
            return
        time.sleep(0.05)
    raise EmulationError(f"nothing listens on port {port} in {node} after {timeout_s} s")


def _wait_ready(proc: subprocess.Popen, what: str) -> None:
    """Wait for the child's 'ready' line; fail the build if it dies or hangs."""
    outcome = wait_ready(proc, READY_TIMEOUT_S)
    if outcome == EXITED:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # closed its stdout yet runs: stop it
            proc.kill()
            proc.wait()
        err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        raise EmulationError(f"{what} exited with {proc.returncode}: {err}")
    if outcome == TIMED_OUT:
        raise EmulationError(f"{what} not ready after {READY_TIMEOUT_S} s")


def _channel_fields(ch: P.Channel, scale: float) -> dict:
    imp = ch.impairment
    return {"nominal_rate_gbit": ch.spec.rate_gbit, "emulated_rate_gbit": ch.htb.emulated_gbit,
            "scale": scale, "burst_bytes": ch.htb.burst_bytes, "rate64": ch.htb.rate64,
            "queue_pkts": ch.queue_pkts,
            "delay_ms": imp.delay_ms if imp else None, "jitter_ms": imp.jitter_ms if imp else None,
            "loss_pct": imp.loss.mean_pct if imp else None}

