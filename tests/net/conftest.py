"""Root-only network tests: skip without root/tools; assert nothing is left."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed.net import naming

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TOPOLOGY = ROOT / "topologies" / "two-dc.yaml"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("mnexec", "iperf3", "ping", "ip")),
    reason="needs root, mnexec, iperf3, ping and ip")


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(": ")[1].split("@")[0] for line in out.splitlines()}


def netns_list() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def state_files() -> set[str]:
    return {p.name for p in naming.STATE_DIR.glob("tb*.json")} if naming.STATE_DIR.is_dir() \
        else set()


def assert_gone(record: dict) -> None:
    """Every process and root interface a run recorded is gone."""
    for p in record["processes"]:
        assert not naming.process_alive(p["pid"], p["start"]), f"left running: {p}"
    for name in record["root_links"]:
        assert not Path(f"/sys/class/net/{name}").exists(), f"left interface {name}"
    assert not naming.state_file(record["prefix"]).exists()
    assert not naming.socket_dir(record["prefix"]).exists()


@pytest.fixture
def clean_host():
    """Snapshot root interfaces, named namespaces and state files; compare after."""
    before = (root_links(), netns_list(), state_files())
    yield
    after = (root_links(), netns_list(), state_files())
    assert after[0] <= before[0], f"interfaces left: {after[0] - before[0]}"
    assert after[1] <= before[1], f"namespaces left: {after[1] - before[1]}"
    assert after[2] <= before[2], f"state files left: {after[2] - before[2]}"
