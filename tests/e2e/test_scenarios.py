"""End to end (root): scenarios run through ``testbed run`` on real namespaces.

Each test runs the CLI as a subprocess into a temporary run directory and
reads summary.json; every test also checks that the run left nothing behind.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.net.conftest import needs_root, root_links, state_files

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [needs_root, pytest.mark.root]


def testbed(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def clean_after():
    before = (root_links(), state_files())
    yield
    assert root_links() <= before[0], f"left: {root_links() - before[0]}"
    assert state_files() <= before[1]


def test_quickstart_passes(tmp_path, clean_after):
    out = tmp_path / "run"
    r = testbed("run", "scenarios/quickstart.yaml", "--out", str(out))
    summary = json.loads((out / "summary.json").read_text())
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary["passed"] and set(summary["modes"]) == {"pdd", "cross-dc-pd"}
    for mode in summary["modes"].values():
        assert mode["tokens_lost"] == 0 and mode["tokens_duplicated"] == 0
    assert (out / "report.md").exists() and list(out.glob("*.png"))


@pytest.mark.parametrize("scenario", ["congestion-short", "link-flap-short"])
def test_faults_complete_without_loss(scenario, tmp_path, clean_after):
    out = tmp_path / "run"
    r = testbed("run", f"tests/e2e/{scenario}.yaml", "--out", str(out))
    assert (out / "summary.json").exists(), r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    pdd = summary["modes"]["pdd"]
    assert pdd["tokens_lost"] == 0 and pdd["tokens_duplicated"] == 0
    records = [json.loads(x) for x in (out / "pdd" / "requests.jsonl").read_text().splitlines()]
    assert records and all(r["status"] == "completed" or r.get("reason") for r in records)
    kinds = {json.loads(x)["kind"] for x in (out / "pdd" / "events.jsonl").read_text().splitlines()}
    assert {"fault_start", "fault_end"} <= kinds


def test_ctrl_c_mid_run_leaves_nothing(tmp_path, clean_after):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run",
                             "tests/e2e/congestion-short.yaml", "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out / "pdd" / "cluster.json").exists():
        time.sleep(0.2)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
