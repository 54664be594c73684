"""Planner and shaping arithmetic: golden plans, burst, BDP limits, RATE64, k."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.net import plan as P
from testbed.net.plan import plan_json
from testbed.net.build import auto_scale, make_plan
from testbed.net.shaping import (GSO_MAX_BYTES, Backend, choose_scale, htb_params,
                                 queue_limit_pkts)
from testbed.spec.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))
GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("backend", list(Backend), ids=lambda b: b.value)
@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_golden_plans(path, backend, request):
    plan = make_plan(load_topology(path), backend, prefix="tb0000", seed=1)
    text = plan_json(plan).replace(str(ROOT) + "/", "") + "\n"
    golden = GOLDEN / f"{path.stem}.{backend.value}.jsonl"
    if request.config.getoption("--update-golden"):
        golden.write_text(text)
    assert golden.exists(), f"no golden plan {golden.name}: run pytest --update-golden"
    assert text == golden.read_text(), f"plan of {path.name} changed; review and --update-golden"


def test_burst_is_at_least_one_ms_and_two_gso_frames():
    assert htb_params(10, 1).burst_bytes == 10e9 / 8 / 1000  # 1.25 MB at 10 Gbit/s
    assert htb_params(0.1, 1).burst_bytes == 2 * GSO_MAX_BYTES


def test_rate64_above_u32_bytes_per_second():
    assert not htb_params(34, 1).rate64          # 4.25 GB/s fits in u32
    assert htb_params(40, 1).rate64              # 5 GB/s does not
    assert htb_params(100, 10).rate_bps == 10_000_000_000


def test_queue_limit_is_one_bdp_unless_given():
    # 1 Gbit/s x 40 ms = 5 MB = 3334 MTU packets
    assert queue_limit_pkts(1_000_000_000, 40, None) == 3334
    assert queue_limit_pkts(1_000_000, 1, None) == 64  # floor
    assert queue_limit_pkts(1_000_000_000, 40, 500) == 500


@pytest.mark.parametrize("wan,intra,backend,k", [
    (10, 100, Backend.USERSPACE, 25), (40, 100, Backend.USERSPACE, 40),
    (100, 100, Backend.USERSPACE, 100), (10, 100, Backend.NETEM, 25),
    (10, 20, Backend.NETEM, 5), (0.5, 4, Backend.USERSPACE, 1), (3, 10, Backend.USERSPACE, 4),
    (10, 10, Backend.USERSPACE, 10),
])
def test_choose_scale(wan, intra, backend, k):
    assert choose_scale(wan, intra, backend) == k


def test_auto_scale_uses_every_link():
    topo = load_topology(ROOT / "topologies/multi-host.yaml")  # WAN 100, intra 200
    assert auto_scale(topo, Backend.NETEM) == 50  # 100/5 = 20 but 200/4 = 50


def _steps(plan, kind):
    return [s for s in plan.steps if isinstance(s, kind)]


def test_userspace_plan_has_delay_lines_and_fifo_leaves():
    plan = make_plan(load_topology(ROOT / "topologies/two-dc.yaml"), Backend.USERSPACE,
                     prefix="tb0000")
    lines = _steps(plan, P.StartDelayLine)
    assert [s.channel.id for s in lines] == ["wan/a>b", "wan/b>a"]
    assert lines[0].channel.delay_line == ("wan-eth0", "wan-eth1")
    assert all(c.impairment is None for c in plan.channels if c.link != "wan")
    wan = plan.channel("wan/a>b")
    assert wan.node == "gwa" and wan.dev == "gwa-eth1" and wan.htb.rate_bps == 0.4e9  # k=25
    assert wan.impairment.seed != plan.channel("wan/b>a").impairment.seed


def test_netem_plan_bridges_the_wan_node_and_has_netem_everywhere():
    plan = make_plan(load_topology(ROOT / "topologies/long-haul-lossy.yaml"), Backend.NETEM,
                     prefix="tb0000")
    assert not _steps(plan, P.StartDelayLine)
    assert _steps(plan, P.BridgePorts)[0].ports == ("wan-eth0", "wan-eth1")
    assert all(c.impairment is not None for c in plan.channels)
    wan = plan.channel("wan/a>b").impairment
    assert wan.loss.model == "gilbert_elliott" and wan.delay_ms == 50
    # netem holds the in-flight packets (rate x (delay + 3 jitter)) plus the queue
    ch = plan.channel("wan/a>b")
    assert wan.limit_pkts > ch.queue_pkts


def test_root_namespace_names_carry_the_prefix_and_fit():
    plan = make_plan(load_topology(ROOT / "topologies/multi-host.yaml"), Backend.USERSPACE,
                     prefix="tbabcd")
    root_names = [s.name for s in _steps(plan, P.AddSwitch)] + \
        [s.intf2 for s in _steps(plan, P.AddLink) if s.node2.startswith("tbabcd")]
    assert root_names and all(n.startswith("tbabcd") and len(n) <= 15 for n in root_names)


def test_no_route_leaves_the_testbed():
    plan = make_plan(load_topology(ROOT / "topologies/two-dc.yaml"), Backend.USERSPACE,
                     prefix="tb0000")
    dsts = {s.dst for s in _steps(plan, P.AddRoute)}
    assert dsts == {"10.77.1.0/24", "10.77.2.0/24", "10.77.0.0/29"}  # no default route
