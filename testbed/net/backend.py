"""Which link backend this kernel supports, found by probing.

Owns ``probe_backend``: in a throwaway namespace (an ``unshare -n`` child,
gone when the child exits) it creates a veth pair, then tries an htb root
and a netem qdisc through pyroute2. netem present -> Backend.NETEM, else
htb present -> Backend.USERSPACE, else no backend (PlanError). Also checks
the tools the testbed runs (mnexec, iperf3, ping).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from testbed.errors import PlanError
from testbed.net.shaping import Backend

TOOLS = ("mnexec", "iperf3", "ping", "ip", "tc", "sysctl")


@dataclass(frozen=True)
class Probe:
    root: bool
    htb: bool
    netem: bool
    tools: dict  # name -> path or None
    kernel: str

    @property
    def backend(self) -> Backend | None:
        if self.netem and self.htb:
            return Backend.NETEM
        if self.htb:
            return Backend.USERSPACE
        return None


def _try_qdiscs() -> tuple[bool, bool]:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    from testbed.net.netem import NetemParams, netem_request, register

    child = subprocess.Popen(["unshare", "-n", "sleep", "30"])
    try:
        for _ in range(100):  # wait until the child is in its new namespace
            if os.readlink(f"/proc/{child.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            __import__("time").sleep(0.01)
        with IPRoute(netns=f"/proc/{child.pid}/ns/net") as ipr:
            ipr.link("add", ifname="probe0", kind="veth", peer="probe1")
            idx = ipr.link_lookup(ifname="probe0")[0]
            htb = netem = True
            try:
                ipr.tc("add", kind="htb", index=idx, handle="1:", default=0x10)
                ipr.tc("add-class", kind="htb", index=idx, handle="1:10", parent="1:",
                       rate="1gbit", burst=1 << 17, cburst=1 << 17)
            except Exception:  # noqa: BLE001 - absence is the answer
                htb = False
            try:  # with the project's own netem encoder (pyroute2's may be swapped out)
                register()
                ipr.tc("add", kind="netem", index=idx, handle="20:",
                       parent="1:10" if htb else "root",
                       **netem_request(NetemParams(delay_us=1000)))
            except NetlinkError:  # no sch_netem: the kernel refuses the kind
                netem = False
        return htb, netem
    finally:
        child.kill()
        child.wait()


def probe_backend(force: Backend | None = None) -> tuple[Backend, Probe]:
    """The backend to use (``force`` if given and possible) and the probe."""
    root = os.geteuid() == 0
    htb, netem = _try_qdiscs() if root else (False, False)
    probe = Probe(root, htb, netem, {t: shutil.which(t) for t in TOOLS}, os.uname().release)
    if not root:
        raise PlanError("building a network needs root (run with sudo)")
    missing = [t for t, p in probe.tools.items() if p is None]
    if missing:
        raise PlanError(f"missing tools: {', '.join(missing)} (see README set-up)")
    if force is Backend.NETEM and not probe.netem:
        raise PlanError(f"backend netem requested but kernel {probe.kernel} has no sch_netem")
    backend = force or probe.backend
    if backend is None:
        raise PlanError(f"kernel {probe.kernel} has no htb qdisc: no backend can shape links")
    return backend, probe
