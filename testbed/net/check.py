"""``testbed check``: what this host can emulate, and how fast.

Owns the host report: root, tools, kernel qdiscs (probe), the backend that
would be used, and - unless skipped - the backend's measured capacity: the
default topology is built with the WAN emulated at increasing rates (scale
1, one-way delay 20 ms) and iperf3 TCP goodput is compared with the target.
The capacity is the highest rate carried within 5%. shaping.WAN_CAPACITY_GBIT
holds the figure used to choose k automatically; check shows whether this
host matches it. Also unless skipped: how late this host wakes a real-time
thread (testbed/net/wakeups.py), the floor under the userspace delay lines'
lateness that the fidelity verdict judges.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from testbed.net.backend import Probe, probe_backend
from testbed.net.shaping import WAN_CAPACITY_GBIT, Backend

CAPACITY_STEPS_GBIT = (0.5, 1.0, 2.0, 4.0)


@dataclass
class CheckReport:
    probe: Probe
    backend: Backend
    assumed_capacity_gbit: float
    steps: list = field(default_factory=list)  # {target_gbit, goodput_gbit, ratio}
    wakeups: dict | None = None  # testbed.net.wakeups.measure_wakeups

    @property
    def measured_capacity_gbit(self) -> float | None:
        ok = [s["target_gbit"] for s in self.steps if s["ratio"] >= 0.95]
        return max(ok) if ok else (None if not self.steps else 0.0)

    def as_dict(self) -> dict:
        return {"probe": asdict(self.probe), "backend": self.backend.value,
                "assumed_capacity_gbit": self.assumed_capacity_gbit,
                "measured_capacity_gbit": self.measured_capacity_gbit, "steps": self.steps,
                "wakeups": self.wakeups}


def measure_capacity(backend: Backend, topo_path: str, seconds: float = 3.0) -> list[dict]:
    from testbed.net.build import EmulatedNetwork, make_plan
    from testbed.net.calibrate import GOODPUT_SHARE, run_iperf, pick_host
    from testbed.spec.topology import Role, load_topology

    topo = load_topology(topo_path).with_wan(delay_ms=20.0, jitter_ms=0.0)
    steps = []
    for target in CAPACITY_STEPS_GBIT:
        plan = make_plan(topo.with_wan(rate_gbit=target), backend, scale=1.0)
        with EmulatedNetwork(plan) as net:
            a, b = topo.datacenters
            src = pick_host(topo, a, (Role.CROSS_TRAFFIC,))
            dst = pick_host(topo, b, (Role.CROSS_TRAFFIC,))
            r = run_iperf(net, src, dst, net.ip(dst), ["-t", str(seconds), "-O", "2"], seconds)
        goodput = r["bps"] / 1e9
        steps.append({"target_gbit": target, "goodput_gbit": round(goodput, 3),
                      "ratio": round(goodput / (target * GOODPUT_SHARE), 3)})
        if steps[-1]["ratio"] < 0.8:
            break
    return steps


def run_check(topo_path: str, measure: bool = True, backend: Backend | None = None) -> CheckReport:
    chosen, probe = probe_backend(backend)
    report = CheckReport(probe, chosen, WAN_CAPACITY_GBIT[chosen])
    if measure:
        from testbed.net.wakeups import measure_wakeups

        report.wakeups = measure_wakeups()  # first, on a quiet host
        report.steps = measure_capacity(chosen, topo_path)
    return report


def format_check(r: CheckReport) -> str:
    p = r.probe
    lines = [f"kernel         {p.kernel}", f"root           {'yes' if p.root else 'NO'}",
             f"qdisc htb      {'yes' if p.htb else 'no'}",
             f"qdisc netem    {'yes' if p.netem else 'no'}",
             "tools          " + ", ".join(f"{t}:{'ok' if v else 'MISSING'}"
                                          for t, v in p.tools.items()),
             f"backend        {r.backend.value}",
             f"capacity       {r.assumed_capacity_gbit:g} Gbit/s assumed for choosing k"]
    for s in r.steps:
        lines.append(f"  WAN {s['target_gbit']:>4g} Gbit/s emulated -> TCP goodput "
                     f"{s['goodput_gbit']:.3f} Gbit/s ({s['ratio'] * 100:.1f}% of expected)")
    if r.steps:
        cap = r.measured_capacity_gbit
        lines.append(f"measured       carries up to {cap:g} Gbit/s within 5%" if cap
                     else "measured       no step within 5%")
    if r.wakeups:
        from testbed.net.wakeups import format_wakeups

        lines += format_wakeups(r.wakeups)
    return "\n".join(lines)
