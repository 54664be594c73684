"""``testbed bench updown``: build and tear down a topology N times, timed.

Owns the up/down benchmark: each cycle builds the network, pings across
the WAN once (it must work), tears down, and checks that nothing the cycle
recorded is left (processes, root interfaces, state file, socket folder).
Reports per-cycle up/down seconds and their mean/max.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from testbed.errors import EmulationError
from testbed.net import naming
from testbed.net.apply import EmulatedNetwork
from testbed.net.build import make_plan
from testbed.net.backend import probe_backend


def record_leftovers(record: dict) -> list[str]:
    """What of a run's registry record (the names and pids it made) still exists."""
    left = [f"process {p['pid']} ({p['what']})" for p in record["processes"]
            if naming.process_alive(p["pid"], p["start"])]
    left += [f"interface {n}" for n in record["root_links"] if Path(f"/sys/class/net/{n}").exists()]
    if naming.state_file(record["prefix"]).exists():
        left.append(f"state file {naming.state_file(record['prefix'])}")
    if naming.socket_dir(record["prefix"]).exists():
        left.append(f"socket folder {naming.socket_dir(record['prefix'])}")
    return left


def updown(topo, cycles: int, backend=None) -> dict:
    chosen, _ = probe_backend(backend)
    ups, downs, problems = [], [], []
    for i in range(cycles):
        plan = make_plan(topo, chosen)
        t0 = time.monotonic()
        with EmulatedNetwork(plan) as net:
            t1 = time.monotonic()
            a, b = topo.datacenters
            r = net.run(a.hosts[0].name, ["ping", "-c", "1", "-W", "3", b.hosts[0].ip])
            if r.returncode != 0:
                raise EmulationError(f"cycle {i}: no ping across the WAN")
            record = net.registry.record
            t2 = time.monotonic()
        t3 = time.monotonic()
        ups.append(t1 - t0)
        downs.append(t3 - t2)
        problems += [f"cycle {i}: {x}" for x in record_leftovers(record)]
    return {"topology": topo.name, "backend": chosen.value, "cycles": cycles,
            "up_s": {"mean": statistics.mean(ups), "max": max(ups)},
            "down_s": {"mean": statistics.mean(downs), "max": max(downs)},
            "leftovers": problems}
