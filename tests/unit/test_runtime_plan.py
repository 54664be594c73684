"""Runtime changes as data: set_link / link up-down / fault restores, without root.

The plans (testbed/net/runtime.py) are checked as data and, through the thin
``apply``, against a recording fake of the pyroute2 calls (``IPRoute.tc`` /
``IPRoute.link``) and of the delay line's control socket.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from testbed.errors import EmulationError, SpecError
from testbed.net import runtime
from testbed.net.build import make_plan
from testbed.net.events import EventLog
from testbed.net.shaping import Backend
from testbed.scenario.faults import actions_for
from testbed.spec.faults import FaultSpec
from testbed.impairment import LossSpec
from testbed.spec.topology import WanSpec, load_topology

ROOT = Path(__file__).resolve().parents[2]
TWO_DC = load_topology(ROOT / "topologies" / "two-dc.yaml")
MULTI_HOST = load_topology(ROOT / "topologies" / "multi-host.yaml")  # reverse: 40 Gbit/s


def _asymmetric_delays():
    """multi-host with one-way delays 15 ms a>b and 5 ms b>a (and its rates 100/40)."""
    w = MULTI_HOST.wan
    return dataclasses.replace(MULTI_HOST, wan=WanSpec(w.subnet, w.a_to_b,
                                                       w.b_to_a.replace(delay_ms=5.0)))


class FakeIPRoute:
    """Records the pyroute2 calls the runtime makes, per namespace."""

    def __init__(self, node, calls):
        self.node, self.calls = node, calls

    def tc(self, command, **kw):
        self.calls.append(("tc", self.node, command, kw))

    def link(self, command, **kw):
        self.calls.append(("link", self.node, command, kw))


class FakeNet:
    """What runtime needs of an EmulatedNetwork: plan, channels, events, sockets."""

    def __init__(self, topo, backend, scale=10.0):
        self.plan = make_plan(topo, backend, scale, prefix="tb0000", seed=1)
        self.channels = {c.id: c for c in self.plan.channels}
        self.events = EventLog()
        self.calls: list = []
        self.delay_line_sets: list = []

    def ipr(self, node):
        return FakeIPRoute(node, self.calls)

    def ifindex(self, node, dev):
        return hash((node, dev)) % 1000 + 1


@pytest.fixture
def fake_delay_lines(monkeypatch):
    def install(net):
        class Control:
            def __init__(self, cid):
                self.cid = cid

            def set(self, params):
                net.delay_line_sets.append((self.cid, params))
        monkeypatch.setattr(runtime, "_delay_line", lambda n, cid: Control(cid))
        return net
    return install


def _leaves(net, kind):
    return {(node, kw["parent"]): kw for what, node, cmd, kw in net.calls
            if what == "tc" and cmd == "change" and kw["kind"] == kind}


def _wan_nodes(net):
    return {cid: net.channels[cid].node for cid in ("wan/a>b", "wan/b>a")}


def test_a_delay_increase_resizes_the_netem_limit_for_the_new_bdp():
    net = FakeNet(TWO_DC, Backend.NETEM)
    before = {cid: net.channels[cid] for cid in ("wan/a>b", "wan/b>a")}
    runtime.set_link(net, "wan", delay_ms=4 * before["wan/a>b"].spec.delay_ms)
    leaves = _leaves(net, "netem")
    assert len(leaves) == 2  # one netem change per direction, no htb change (rate kept)
    assert not [c for c in net.calls if c[2] == "change-class"]
    for cid, node in _wan_nodes(net).items():
        req = next(kw for (n, _), kw in leaves.items() if n == node)
        old = before[cid]
        assert req["delay_us"] == round(4 * old.spec.delay_ms * 1000)
        # a BDP-sized queue and stage: ~4x the packets in flight and queued
        assert req["limit_pkts"] > 3 * old.impairment.limit_pkts
        assert net.channels[cid].queue_pkts > 3 * old.queue_pkts
        assert req["limit_pkts"] == net.channels[cid].impairment.limit_pkts


def test_on_netem_the_delay_stage_is_the_root_and_the_shaper_its_child():
    """netem 1: at the root, htb 2: its child, class 2:10, pfifo 20: of queue_pkts: the
    class's backlog is what waits for the rate, never a packet held for its delay."""
    from pyroute2.netlink.rtnl import TC_H_ROOT
    from testbed.net import tc

    for backend, want in ((Backend.NETEM, [("replace", "netem", "1:", TC_H_ROOT),
                                           ("replace", "htb", "2:", "1:1"),
                                           ("replace-class", "htb", "2:10", "2:"),
                                           ("replace", "pfifo", "20:", "2:10")]),
                          (Backend.USERSPACE, [("replace", "htb", "1:", TC_H_ROOT),
                                               ("replace-class", "htb", "1:10", "1:"),
                                               ("replace", "pfifo", "10:", "1:10")])):
        net = FakeNet(TWO_DC, backend)
        ch = net.channels["wan/a>b"]
        tc.shape(FakeIPRoute(ch.node, net.calls), 7, ch, netem=backend is Backend.NETEM)
        assert [(c, kw["kind"], kw["handle"], kw["parent"]) for _, _, c, kw in net.calls] == want
        assert net.calls[-1][3]["limit"] == ch.queue_pkts
        if backend is Backend.NETEM:
            assert net.calls[0][3]["limit_pkts"] == ch.impairment.limit_pkts > ch.queue_pkts


def test_a_delay_increase_on_netem_resizes_the_shapers_queue_and_the_stages_limit():
    from pyroute2.netlink.rtnl import TC_H_ROOT

    net = FakeNet(TWO_DC, Backend.NETEM)
    before = net.channels["wan/a>b"]
    runtime.set_link(net, "wan", delay_ms=4 * before.spec.delay_ms)
    new = net.channels["wan/a>b"]
    pfifos, stages = _leaves(net, "pfifo"), _leaves(net, "netem")
    assert pfifos[(before.node, "2:10")]["limit"] == new.queue_pkts > 3 * before.queue_pkts
    assert stages[(before.node, TC_H_ROOT)]["handle"] == "1:"
    assert stages[(before.node, TC_H_ROOT)]["limit_pkts"] == new.impairment.limit_pkts


def test_a_delay_change_on_one_wan_direction_resizes_the_other_directions_queue():
    net = FakeNet(TWO_DC, Backend.NETEM)
    ba_before = net.channels["wan/b>a"]
    changed = runtime.set_link(net, "wan/a>b", delay_ms=100.0)
    assert [c.id for c in changed] == ["wan/a>b"]
    ba = net.channels["wan/b>a"]
    assert ba.spec == ba_before.spec  # its delay is its own
    assert ba.queue_pkts > ba_before.queue_pkts  # but the WAN RTT it queues for grew
    kinds = [e["kind"] for e in net.events.records]
    assert kinds == ["set_link", "queue_resize"]


def test_a_rate_change_keeps_the_queue_and_changes_only_the_htb_class():
    net = FakeNet(TWO_DC, Backend.NETEM)
    before = net.channels["wan/a>b"]
    runtime.set_link(net, "wan/a>b", rate_gbit=1.0)
    assert [(c[2], c[3]["kind"]) for c in net.calls] == [("change-class", "htb")]
    assert net.calls[0][3]["rate"] == f"{round(1e9 / 10)}bit"
    assert net.channels["wan/a>b"].queue_pkts == before.queue_pkts


def test_userspace_delay_increase_resizes_the_pfifo_and_the_delay_line(fake_delay_lines):
    net = fake_delay_lines(FakeNet(TWO_DC, Backend.USERSPACE))
    before = net.channels["wan/a>b"]
    runtime.set_link(net, "wan", delay_ms=50.0)
    pfifos = _leaves(net, "pfifo")
    assert len(pfifos) == 2
    sent = dict(net.delay_line_sets)
    assert set(sent) == {"wan/a>b", "wan/b>a"}
    p = sent["wan/a>b"]
    assert p.delay_ms == 50.0 and p.up and p.seed == before.impairment.seed
    assert p.limit_pkts == net.channels["wan/a>b"].impairment.limit_pkts
    assert p.limit_pkts > before.impairment.limit_pkts
    assert pfifos[(before.node, "1:10")]["limit"] == net.channels["wan/a>b"].queue_pkts


def test_an_asymmetric_link_keeps_each_directions_rate_and_sizes_each_for_its_own():
    net = FakeNet(MULTI_HOST, Backend.NETEM)
    runtime.set_link(net, "wan", delay_ms=20.0)
    ab, ba = net.channels["wan/a>b"], net.channels["wan/b>a"]
    assert (ab.spec.rate_gbit, ba.spec.rate_gbit) == (100.0, 40.0)
    assert not [c for c in net.calls if c[2] == "change-class"]
    limits = {node: kw["limit_pkts"] for (node, _), kw in _leaves(net, "netem").items()}
    assert limits[ab.node] > limits[ba.node]  # 100 vs 40 Gbit/s over the same 40 ms RTT


def test_host_link_delay_needs_netem_and_unknown_links_are_named():
    net = FakeNet(TWO_DC, Backend.USERSPACE)
    with pytest.raises(EmulationError, match="needs the netem backend"):
        runtime.plan_set_link(net.plan, net.channels, "host:p1", delay_ms=1.0)
    with pytest.raises(EmulationError, match="no link 'host:nope'.*wan"):
        runtime.plan_set_link(net.plan, net.channels, "host:nope", rate_gbit=1.0)
    with pytest.raises(SpecError, match="delay_ms"):
        runtime.plan_set_link(net.plan, net.channels, "wan", delay_ms=-1.0)
    assert net.calls == []


def test_link_down_plans_the_far_ports():
    net = FakeNet(TWO_DC, Backend.NETEM)
    ops = runtime.plan_link_state(net.plan, net.channels, "wan", "down")
    assert ops == (runtime.SetLinkState("wan", "wan-eth0", "down"),
                   runtime.SetLinkState("wan", "wan-eth1", "down"))
    host = runtime.plan_link_state(net.plan, net.channels, "host:p1/up", "up")
    assert host == (runtime.SetLinkState(None, net.channels["host:p1/down"].dev, "up"),)
    runtime.link_down(net, "wan")
    assert [(c[1], c[3]["state"]) for c in net.calls] == [("wan", "down"), ("wan", "down")]


def _run(actions):
    for a in actions:
        a.run()


@pytest.mark.parametrize("backend", list(Backend), ids=lambda b: b.value)
def test_fault_restores_each_direction_to_its_own_values(backend, fake_delay_lines):
    net = fake_delay_lines(FakeNet(_asymmetric_delays(), backend))
    before = dict(net.channels)
    faults = [FaultSpec(0, 1.0, "rtt", duration_s=1.0,
                        params={"one_way_delay_ms": 40.0, "jitter_ms": 1.0}),
              FaultSpec(1, 3.0, "bandwidth", duration_s=1.0, params={"rate_gbit": 10.0}),
              FaultSpec(2, 5.0, "loss", duration_s=1.0,
                        params={"loss": LossSpec("random", pct=2.0)}),
              FaultSpec(3, 7.0, "duplicate", duration_s=1.0, params={"pct": 5.0})]
    for f in faults:
        start, end = actions_for(f, net, roles=None)
        start.run()
        assert net.channels["wan/a>b"].spec != before["wan/a>b"].spec
        end.run()
        for cid in ("wan/a>b", "wan/b>a"):
            assert net.channels[cid] == before[cid], (f.kind, cid)
    assert net.channels["wan/b>a"].spec.delay_ms == 5.0  # not a>b's 15


@pytest.mark.parametrize("backend", list(Backend), ids=lambda b: b.value)
def test_duplicate_reaches_the_delay_stage_and_keeps_the_queue(backend, fake_delay_lines):
    net = fake_delay_lines(FakeNet(TWO_DC, backend))
    before = dict(net.channels)
    runtime.set_link(net, "wan/a>b", duplicate_pct=5.0)
    ab = net.channels["wan/a>b"]
    assert ab.impairment.duplicate_pct == 5.0 and ab.queue_pkts == before["wan/a>b"].queue_pkts
    assert net.channels["wan/b>a"] == before["wan/b>a"]
    if backend is Backend.NETEM:
        (leaf,) = _leaves(net, "netem").values()
        assert leaf["duplicate_pct"] == 5.0
    else:
        assert [(cid, p.duplicate_pct) for cid, p in net.delay_line_sets] == [("wan/a>b", 5.0)]


def test_rtt_fault_restore_sends_each_direction_its_own_delay():
    net = FakeNet(_asymmetric_delays(), Backend.NETEM)
    start, end = actions_for(FaultSpec(0, 1.0, "rtt", duration_s=1.0,
                                       params={"one_way_delay_ms": 40.0, "jitter_ms": 0.0}),
                             net, roles=None)
    start.run()
    net.calls.clear()
    end.run()
    sent = {node: kw["delay_us"] for (node, _), kw in _leaves(net, "netem").items()}
    nodes = _wan_nodes(net)
    assert sent == {nodes["wan/a>b"]: 15_000, nodes["wan/b>a"]: 5_000}


def test_an_event_log_starts_its_file_afresh(tmp_path):
    # a second run into the same folder (reproduce --resume rerunning an unfinished slot,
    # the README command run twice) must not keep the first run's events: goodput's
    # workload window would span both runs
    path = tmp_path / "pdd" / "events.jsonl"
    first = EventLog(path)
    first.record("workload_start", n_requests=3)
    first.record("workload_end", client_exit=0)
    first.close()
    second = EventLog(path)
    second.record("workload_start", n_requests=5)
    second.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(r["kind"], r.get("n_requests")) for r in lines] == [("workload_start", 5)]
