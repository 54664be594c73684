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


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def clean_after():
    before = (root_links(), state_files())
    yield
    assert root_links() <= before[0], f"left: {root_links() - before[0]}"
    assert state_files() <= before[1]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    before = (root_links(), state_files())
    out = tmp_path_factory.mktemp("quickstart") / "run"
    r = run_cli("run", "scenarios/quickstart.yaml", "--out", str(out))
    assert root_links() <= before[0] and state_files() <= before[1], "the run left things"
    return r, out


def records(out: Path, mode: str) -> list[dict]:
    return [json.loads(x) for x in (out / mode / "requests.jsonl").read_text().splitlines()]


def test_quickstart_passes(quickstart):
    r, out = quickstart
    summary = json.loads((out / "summary.json").read_text())
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary["passed"] and set(summary["modes"]) == {"pdd", "cross-dc-pd"}
    for mode in summary["modes"].values():
        assert mode["tokens_lost"] == 0 and mode["tokens_duplicated"] == 0
        assert mode["requests_verified"] == 24 and mode["requests_mismatched"] == 0
    assert (out / "report.md").exists() and list(out.glob("*.png"))
    fid = summary["fidelity"]  # the verdict itself depends on the machine: only reported here
    assert fid["verdict"] in ("faithful", "degraded") and fid["policy"] == "report"
    for name, mode in fid["modes"].items():
        assert set(mode["compute"]["roles"]) == {"client", "router", "p1", "rld1", "md1"}, name
        assert mode["compute"]["roles"]["md1"]["steps"] > 0
        assert len(mode["host"]["cpu_busy_share"]) >= 1
        assert mode["network"]["rtt"]["probes"] > 0
        if summary["backend"] == "userspace":
            assert mode["network"]["delay_lines"]["wan/a>b"]["frames"] > 0
    assert "**Fidelity: " in (out / "report.md").read_text()


def test_quickstart_with_both_cores_busy_is_degraded_and_strict_exits_2(tmp_path, clean_after):
    """Two CPU hogs (each ends itself after 400 s, and is killed when the test ends) keep
    both cores busy through the whole run: the verdict must say the host did not keep up,
    naming the figure, and a scenario that declares ``fidelity: strict`` exits 2.

    The hogs are the processes killed, not a ``timeout`` wrapper: killing the wrapper
    left its child spinning for the rest of the test session (the suite after this test
    ran on a fully busy machine)."""
    text = (ROOT / "scenarios" / "quickstart.yaml").read_text()
    strict = tmp_path / "quickstart-strict.yaml"
    strict.write_text(text.replace("topology: ../topologies/",
                                   f"topology: {ROOT / 'topologies'}/") + "\nfidelity: strict\n")
    hog = "import time\nend = time.monotonic() + 400\nwhile time.monotonic() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(2)]
    try:
        out = tmp_path / "run"
        r = run_cli("run", str(strict), "--out", str(out))
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert r.returncode == 2, r.stdout + r.stderr
    fid = json.loads((out / "summary.json").read_text())["fidelity"]
    assert fid["verdict"] == "degraded" and fid["policy"] == "strict"
    assert any("busiest core" in why for why in fid["reasons"]), fid["reasons"]
    assert "fidelity: strict" in r.stderr and "busiest core" in r.stderr


def test_relayed_ttft_stays_below_the_wan_kv_transfer(quickstart):
    """After prefill, a relayed request's first token comes over the intra-DC
    path: that wait is far below its WAN KV transfer time."""
    _, out = quickstart
    relayed = [r for r in records(out, "pdd") if r["pipeline"].startswith("p-rld-md")
               and (r["reports"].get("MD") or {}).get("kv_transfer_s")]
    assert relayed, "no relayed request with a measured WAN KV transfer"
    ratios = []
    for r in relayed:
        p = r["reports"]["P"]
        prefill_s = p["queue_s"] + max(p["prefill_real_s"], p["prefill_modeled_s"])  # scaled
        ratios.append((r["ttft_s"] - prefill_s) / r["reports"]["MD"]["kv_transfer_s"])
    ratios.sort()
    # The median relayed first token comes before the KV could have crossed the WAN: what
    # relaying is for. How far before depends on whether the machine keeps the roles' real
    # compute within their modelled steps: the median ratio was ~0.02-0.1 where it did
    # (an earlier machine: relay overhead p50 9 ms) and 0.597 on the slower machine of
    # 2026-12-02 (commit a205e9f; runs/suite2/quickstart: relay overhead p50 183 ms,
    # 62-86% of decode steps overran), so the figure itself is reported (summary.json
    # relay_overhead_p50_ms), not bounded here.
    assert ratios[len(ratios) // 2] < 1.0, ratios


def test_link_counters_carry_the_kv_and_only_token_ids_for_handoff(quickstart):
    _, out = quickstart
    recs = records(out, "pdd")
    kv_wan = sum(r["bytes"]["kv_wan"] for r in recs)
    rows = [x.split(",") for x in (out / "pdd" / "links.csv").read_text().splitlines()[1:]]
    wan_ab = [int(x[3]) for x in rows if x[1] == "wan" and x[2] == "a>b"]
    carried = wan_ab[-1] - wan_ab[0]
    assert kv_wan <= carried <= 1.15 * kv_wan + 2_000_000, (kv_wan, carried)
    handed = [(r["bytes"]["handoff"], r["handoff"]["tokens"]) for r in recs
              if r["handoff"]["tokens"]]
    assert handed, "no handoff happened"
    per_token = sum(b for b, _ in handed) / sum(n for _, n in handed)
    kv_per_token = 50_000 * 32 / json.loads((out / "metadata.json").read_text())["scale"]
    assert per_token < 32 and per_token < kv_per_token / 1000, per_token


@pytest.mark.parametrize("scenario", ["congestion-short", "link-flap-short"])
def test_faults_complete_without_loss(scenario, tmp_path, clean_after):
    out = tmp_path / "run"
    r = run_cli("run", f"tests/e2e/{scenario}.yaml", "--out", str(out))
    assert (out / "summary.json").exists(), r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    pdd = summary["modes"]["pdd"]
    assert pdd["tokens_lost"] == 0 and pdd["tokens_duplicated"] == 0
    records = [json.loads(x) for x in (out / "pdd" / "requests.jsonl").read_text().splitlines()]
    assert records and all(r["status"] == "completed" or r.get("reason") for r in records)
    kinds = {json.loads(x)["kind"] for x in (out / "pdd" / "events.jsonl").read_text().splitlines()}
    assert {"fault_start", "fault_end"} <= kinds


def test_killed_and_restarted_main_decoder_loses_no_request(tmp_path, clean_after):
    out = tmp_path / "run"
    r = run_cli("run", "tests/e2e/kill-md-short.yaml", "--out", str(out))
    assert (out / "summary.json").exists(), r.stdout + r.stderr
    recs = records(out, "pdd")
    assert len(recs) == 12
    kinds = [json.loads(x)["kind"] for x in (out / "pdd" / "events.jsonl").read_text().splitlines()]
    assert "process_kill" in kinds and "process_restart" in kinds
    for rec in recs:  # failover: every request completes with every token once
        assert rec["status"] == "completed", (rec["id"], rec["reason"])
        assert rec["tokens_lost"] == 0 and len(rec["tokens"]) == rec["max_out"]
        assert rec["tokens_duplicated"] == 0
    assert json.loads((out / "pdd" / "verify.json").read_text())["mismatched"] == []


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
