"""The emulated network on this host's backend: build, accuracy, runtime, cleanup.

Tolerances are the calibration's: rate +-5% of nominal/k (TCP goodput at
1448/1514 of the wire rate), RTT +-2 ms, loss +-0.3 points.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from testbed.errors import ApplyError
from testbed.net import runtime
from testbed.net.apply import EmulatedNetwork
from testbed.net.build import open_network
from testbed.net.calibrate import (GOODPUT_SHARE, CalibrateOptions, calibrate, parse_ping,
                                   run_iperf)
from testbed.net.crosstraffic import start_cross_traffic
from testbed.net.registry import clean_stale
from testbed.spec.topology import load_topology

from .conftest import DEFAULT_TOPOLOGY, ROOT, assert_gone, needs_root, root_links

pytestmark = [needs_root, pytest.mark.root]


@pytest.fixture
def topo():
    return load_topology(DEFAULT_TOPOLOGY)


def ping_avg(net, src, dst, count=20):
    net.run(src, ["ping", "-c", "1", "-W", "2", net.ip(dst)])
    r = net.run(src, ["ping", "-q", "-c", str(count), "-i", "0.02", "-W", "2", net.ip(dst)])
    return parse_ping(r.stdout)


def goodput_mbit(net, src, dst, seconds=3):
    r = run_iperf(net, src, dst, net.ip(dst), ["-t", str(seconds), "-O", "1"], seconds)
    return r["bps"] / 1e6


def test_build_and_teardown_leave_nothing(topo, clean_host):
    with open_network(topo) as net:
        record = json.loads(json.dumps(net.registry.record))
        assert {"p1", "rld1", "md1", "gwa", "gwb", "wan"} <= set(net.nodes)
        assert record["root_links"] and record["processes"]
        # hosts reach across the WAN and inside their DC; nothing has a default route
        assert ping_avg(net, "client", "md1", 3)["received"] == 3
        routes = net.run("p1", ["ip", "route"]).stdout
        assert "default" not in routes
    assert_gone(record)


def test_build_and_teardown_close_their_descriptors(topo, clean_host):
    """A long-lived launcher (testbed suite) builds a network per mode: each teardown
    must close what its build opened (the namespaces' shells' ptys leaked two per host
    until a suite's 19th scenario passed select()'s 1024)."""
    with open_network(topo):
        pass  # whatever is opened once and kept (loggers, netlink) is opened here
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(2):
        with open_network(topo):
            pass
    assert len(os.listdir("/proc/self/fd")) <= before


def test_wan_rtt_rate_and_loss_within_tolerance(topo, clean_host):
    with open_network(topo.with_wan(loss=__import__("testbed.spec.link", fromlist=["LossSpec"])
                                    .LossSpec("random", pct=1.0))) as net:
        [wan] = calibrate(net, CalibrateOptions(links=("wan",), seconds=5))
    failed = [(c.name, c.configured, c.measured) for c in wan.checks if not c.passed]
    assert not failed, failed


def test_host_link_rate_within_tolerance(topo, clean_host):
    with open_network(topo) as net:
        [p1] = calibrate(net, CalibrateOptions(links=("host:p1",)))
    failed = [(c.name, c.configured, c.measured) for c in p1.checks if not c.passed]
    assert not failed, failed


def test_runtime_delay_and_rate_change(topo, clean_host):
    with open_network(topo) as net:
        assert ping_avg(net, "xa1", "xb1")["avg_ms"] == pytest.approx(40, abs=2)
        runtime.set_link(net, "wan", delay_ms=30, rate_gbit=5)  # k=25: 200 Mbit/s
        assert ping_avg(net, "xa1", "xb1")["avg_ms"] == pytest.approx(60, abs=2)
        want = 5e9 / net.plan.scale * GOODPUT_SHARE / 1e6
        assert goodput_mbit(net, "xa1", "xb1", 4) == pytest.approx(want, rel=0.05)
        kinds = [e["kind"] for e in net.events.records]
        assert kinds.count("set_link") == 2  # one per direction, logged


def _limits(net, ch) -> dict[str, int]:
    """The packet limit of each qdisc on the channel's interface, by handle."""
    out = net.run(ch.node, ["tc", "qdisc", "show", "dev", ch.dev]).stdout if ch.node else \
        subprocess.run(["tc", "qdisc", "show", "dev", ch.dev], capture_output=True,
                       text=True, check=True).stdout
    return {line.split()[2]: int(line.split(" limit ")[1].split()[0].rstrip("p"))
            for line in out.splitlines() if line.startswith("qdisc ") and " limit " in line}


def test_a_delay_increase_resizes_the_kernels_queue_limit(topo, clean_host):
    """The shaper's pfifo (both backends) and netem's stage (netem) follow the new BDP."""
    with open_network(topo) as net:
        netem = net.plan.backend.value == "netem"
        ch = net.channels["wan/a>b"]
        queue, stage = ("20:", "1:") if netem else ("10:", None)
        assert _limits(net, ch)[queue] == ch.queue_pkts
        if netem:
            assert _limits(net, ch)[stage] == ch.impairment.limit_pkts
        runtime.set_link(net, "wan", delay_ms=4 * ch.spec.delay_ms)
        new = net.channels["wan/a>b"]
        assert new.queue_pkts > 3 * ch.queue_pkts
        assert _limits(net, new)[queue] == new.queue_pkts
        if netem:
            assert _limits(net, new)[stage] == new.impairment.limit_pkts
        assert ping_avg(net, "xa1", "xb1")["avg_ms"] == pytest.approx(160, abs=3)


def test_link_down_and_up(topo, clean_host):
    with open_network(topo) as net:
        assert ping_avg(net, "client", "md1", 3)["received"] == 3
        runtime.link_down(net, "wan")
        r = net.run("client", ["ping", "-c", "3", "-i", "0.2", "-W", "1", net.ip("md1")])
        assert "3 packets transmitted, 0 received" in r.stdout
        runtime.link_up(net, "wan")
        time.sleep(0.2)
        assert ping_avg(net, "client", "md1", 3)["received"] == 3
        assert [e["kind"] for e in net.events.records][-2:] == ["link_down", "link_up"]


def test_cross_traffic_shares_the_wan(topo, clean_host):
    with open_network(topo) as net:
        alone = goodput_mbit(net, "p1", "md1")
        flows = start_cross_traffic(net, n_flows=4)
        time.sleep(2)  # let the cross flows leave slow start
        t0, before = time.monotonic(), runtime.channel_counter(net, "wan/a>b")["bytes"]
        shared = goodput_mbit(net, "p1", "md1", seconds=5)
        t1, after = time.monotonic(), runtime.channel_counter(net, "wan/a>b")["bytes"]
        assert all(p.poll() is None for p in flows.procs), "cross traffic died"
        flows.stop()
    link = 10e9 / net.plan.scale / 1e6
    wire = (after - before) * 8 / (t1 - t0) / 1e6
    assert alone == pytest.approx(link * GOODPUT_SHARE, rel=0.05)
    assert wire == pytest.approx(link, rel=0.05)          # the WAN stays full
    assert shared < 0.8 * alone                           # the flow lost bandwidth ...
    assert wire * GOODPUT_SHARE - shared > 0.15 * link    # ... to the cross traffic


def test_exception_mid_build_leaves_nothing(topo, clean_host, monkeypatch):
    def boom(self, step):
        raise ApplyError(step, "injected failure")

    monkeypatch.setattr(EmulatedNetwork, "_StartDelayLine", boom)
    net = open_network(topo)
    with pytest.raises(ApplyError, match="injected"):
        with net:
            pass
    assert_gone(net.registry.record)
    assert net.registry.record["processes"]  # it had started things before failing


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_tears_down(sig, clean_host):
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/net/hold_network.py"),
                             str(DEFAULT_TOPOLOGY)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    assert line[0] == "up", line
    record = json.loads((__import__("testbed.net.naming", fromlist=["x"])
                         .state_file(line[1])).read_text())
    proc.send_signal(sig)
    assert proc.wait(timeout=30) != 0
    assert_gone(record)


def test_sigkill_then_clean_removes_the_rest(clean_host):
    from testbed.net import naming

    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/net/hold_network.py"),
                             str(DEFAULT_TOPOLOGY)], stdout=subprocess.PIPE, text=True)
    prefix = proc.stdout.readline().split()[1]
    record = json.loads(naming.state_file(prefix).read_text())
    proc.kill()
    proc.wait()
    assert set(record["root_links"]) <= root_links()  # SIGKILL left them
    cleaned = dict(clean_stale())
    assert cleaned[prefix] == []
    assert_gone(record)
