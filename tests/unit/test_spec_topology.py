"""Topology validation: every error names file, YAML path, expected and got."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from testbed.errors import SpecError
from testbed.impairment import LossSpec
from testbed.reader import load_yaml
from testbed.spec.topology import Role, load_topology, parse_topology

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))

BASE = {
    "name": "t",
    "datacenters": [
        {"name": "a", "subnet": "10.9.1.0/24",
         "hosts": [{"name": "p1", "roles": ["prefill"]}, {"name": "rld1", "roles": ["relay_decode"]},
                   {"name": "client", "roles": ["client", "router"]}]},
        {"name": "b", "subnet": "10.9.2.0/24", "hosts": [{"name": "md1", "roles": ["main_decode"]}]},
    ],
    "wan": {"subnet": "10.9.0.0/29", "link": {"rate_gbit": 10, "delay_ms": 20}},
}


def with_change(path: str, value):
    data = copy.deepcopy(BASE)
    keys = path.split(".")
    node = data
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    last = keys[-1]
    if value is DELETE:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return data


DELETE = object()


@pytest.mark.parametrize("path,value,where,expected", [
    ("wan.link.delay_ms", -1, "wan.link.delay_ms", ">= 0"),
    ("wan.link.rate_gbit", 0, "wan.link.rate_gbit", "> 0"),
    ("wan.link.rate_gbit", "10Gbit", "wan.link.rate_gbit", "units are in the field name"),
    ("wan.link.delay_ms", "20ms", "wan.link.delay_ms", "a number of ms"),
    ("wan.link.loss_pct", 101, "wan.link.loss_pct", "<= 100"),
    ("wan.link.loss_pct", -0.5, "wan.link.loss_pct", ">= 0"),
    ("wan.link.jitter_ms", -2, "wan.link.jitter_ms", ">= 0"),
    ("wan.link.jitter_distribution", "gauss", "wan.link.jitter_distribution", "one of uniform"),
    ("wan.link.reorder_pct", 5, None, None),  # allowed with a delay: no error
    ("wan.link", {"rate_gbit": 10, "reorder_pct": 5}, "wan.link.reorder_pct",
     "reordering needs a delay"),  # LinkSpec's rule, named by its YAML field
    ("wan.link.queue_limit_pkts", 0, "wan.link.queue_limit_pkts", "an integer >= 1"),
    ("wan.link.rate", 10, "wan.link.rate", "a known field"),
    ("wan.link.loss", {"model": "gilbert_elliott", "p_pct": 1, "r_pct": 0},
     "wan.link.loss.r_pct", "> 0 when p_pct > 0"),
    ("wan.link.loss", {"model": "bursty"}, "wan.link.loss.model", "one of random"),
    ("wan.link.loss", {"model": "random", "pct": 150}, "wan.link.loss.pct", "<= 100"),
    ("wan.subnet", "10.9.0.0/33", "wan.subnet", "an IPv4 network"),
    ("wan.subnet", "8.8.8.0/29", "wan.subnet", "a private IPv4 network"),
    ("wan.subnet", "10.9.1.0/29", "wan.subnet", "not overlapping"),
    ("datacenters.0.hosts.0.name", "prefillnode1", "datacenters[0].hosts[0].name",
     "fits in 15 characters"),
    ("datacenters.0.hosts.0.name", "P1", "datacenters[0].hosts[0].name", "lowercase"),
    ("datacenters.0.hosts.1.name", "p1", "datacenters[0].hosts[1].name", "not used elsewhere"),
    ("datacenters.0.hosts.1.name", "wan", "datacenters[0].hosts[1].name", "reserved"),
    ("datacenters.0.hosts.1.name", "gwb", "datacenters[0].hosts[1].name", "reserved"),
    ("datacenters.0.hosts.0.roles", ["prefil"], "datacenters[0].hosts[0].roles[0]", "one of prefill"),
    ("datacenters.0.hosts.0.roles", [], "datacenters[0].hosts[0].roles", "at least 1"),
    ("datacenters.0.hosts.0.ip", "10.9.2.5", "datacenters[0].hosts[0].ip", "a host address in"),
    ("datacenters.0.hosts.0.ip", "10.9.1.1", "datacenters[0].hosts[0].ip", "other than the gateway"),
    ("datacenters.0.hosts.1.ip", "10.9.1.10", "datacenters[0].hosts[1].ip", "not used by"),
    ("datacenters.0.hosts.0.colour", "red", "datacenters[0].hosts[0].colour", "a known field"),
    ("datacenters.1.name", "a", "datacenters[1].name", "other than datacenters[0]"),
    ("datacenters.1.subnet", "10.9.1.0/24", "datacenters[1].subnet", "not overlapping"),
    ("datacenters.0.host_link", {"rate_gbit": -5}, "datacenters[0].host_link.rate_gbit", "> 0"),
    ("datacenters.1.hosts.0.roles", ["prefill"], "datacenters", "prefill hosts in exactly one"),
    ("datacenters.1.hosts.0.roles", ["relay_decode"], "datacenters", "relay_decode hosts next to"),
    ("wan", DELETE, "wan", "this field to be set"),
    ("name", 7, "name", "a non-empty string"),
])
def test_validation_errors(path, value, where, expected):
    data = with_change(path, value)
    if where is None:
        parse_topology(data, "t.yaml")
        return
    with pytest.raises(SpecError) as ei:
        parse_topology(data, "t.yaml")
    e = ei.value
    assert e.file == "t.yaml"
    assert e.path.split(" (line")[0] == where, str(e)
    assert expected in e.expected, str(e)
    assert str(e).startswith("t.yaml: " + where)


def test_one_datacenter_is_an_error():
    data = copy.deepcopy(BASE)
    data["datacenters"] = data["datacenters"][:1]
    with pytest.raises(SpecError, match="at least 2"):
        parse_topology(data, "t.yaml")


def test_errors_carry_the_yaml_line(tmp_path):
    f = tmp_path / "bad.yaml"
    text = yaml.safe_dump(with_change("wan.link.delay_ms", -3), sort_keys=False)
    f.write_text(text)
    with pytest.raises(SpecError) as ei:
        load_topology(f)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "delay_ms" in t)
    assert ei.value.path == f"wan.link.delay_ms (line {line})"
    assert str(f) in str(ei.value)


def test_yaml_syntax_and_duplicate_keys(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("name: a\nname: b\n")
    with pytest.raises(SpecError, match="duplicate key"):
        load_yaml(f)
    f.write_text("name: [a\n")
    with pytest.raises(SpecError, match="valid YAML"):
        load_yaml(f)
    with pytest.raises(SpecError, match="readable"):
        load_yaml(tmp_path / "missing.yaml")


def test_defaults_and_auto_addresses():
    t = parse_topology(copy.deepcopy(BASE), "t.yaml")
    assert [h.ip for h in t.hosts] == ["10.9.1.10", "10.9.1.11", "10.9.1.12", "10.9.2.10"]
    assert t.wan.a_to_b == t.wan.b_to_a and t.wan.rtt_ms == 40
    assert t.hosts_with(Role.ROUTER)[0].name == "client"
    assert t.host("p1").link.rate_gbit == 100 and t.host("p1").link.delay_ms == 0.005


def test_reverse_direction_overrides_only_given_fields():
    data = with_change("wan.reverse", {"rate_gbit": 4})
    t = parse_topology(data, "t.yaml")
    assert t.wan.b_to_a.rate_gbit == 4 and t.wan.b_to_a.delay_ms == 20


def test_gilbert_elliott_mean_loss():
    ge = LossSpec("gilbert_elliott", p_pct=1, r_pct=24, bad_loss_pct=50, good_loss_pct=0)
    assert ge.mean_pct == pytest.approx(100 * (0.01 / 0.25) * 0.5)


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.name)
def test_shipped_topologies_are_valid(path):
    t = load_topology(path)
    assert t.hosts_with(Role.PREFILL) and t.hosts_with(Role.MAIN_DECODE)
    assert 10 <= t.wan.a_to_b.rate_gbit <= 100
