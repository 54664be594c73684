"""testbed compare: runs side by side, from run directories only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testbed.report.compare import compare_runs, format_comparison
from testbed.report.rundir import LINKS_HEADER, load_run


def _run_dir(path, backend, ttfts, kv_s, rtt_ms, wan_bytes, scale=10.0, failed=0, relayed=0):
    path.mkdir()
    (path / "metadata.json").write_text(json.dumps(
        {"scenario": "x", "backend": backend, "scale": scale, "kernel": "k", "modes": ["pdd"]}))
    mode = path / "pdd"
    mode.mkdir()
    reqs = [{"id": i, "status": "completed", "ttft_s": t, "e2e_s": t + 1.0,
             "tokens": [[j, 1, 0.0, "MD"] for j in range(11)],
             "reports": {"MD": {"kv_transfer_s": kv}, "P": {"prefill_real_s": kv / 10}}} for i, (t, kv) in enumerate(zip(ttfts, kv_s))]
    for r in reqs[:relayed]:  # RLD decoded the first 4 of its 11 tokens
        r["pipeline"] = "p-rld-md"
        r["tokens"] = [[j, 1, 0.0, "RLD" if j < 4 else "MD"] for j in range(11)]
    reqs += [{"id": 100 + i, "status": "failed", "reason": "timeout"} for i in range(failed)]
    (mode / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reqs))
    (mode / "events.jsonl").write_text(json.dumps(
        {"t_mono": 1.0, "kind": "preflight", "rtt_measured_ms": rtt_ms}) + "\n")
    rows = [",".join(LINKS_HEADER)]
    for t, b in ((1.0, 500), (2.0, 500 + wan_bytes)):
        rows += [f"{t},wan,a>b,{b},1,0,10,1", f"{t},wan,b>a,{b // 10},1,0,10,1"]
    (mode / "links.csv").write_text("\n".join(rows) + "\n")
    return path


def _by_name(rows):
    return {(r.mode, r.figure): r for r in rows}


def test_every_figure_side_by_side_with_its_spread(tmp_path):
    a = _run_dir(tmp_path / "a", "userspace", [1.0, 2.0, 3.0], [0.5, 0.5, 1.0], 40.5, 1000)
    b = _run_dir(tmp_path / "b", "netem", [1.1, 2.2, 3.3], [0.6, 0.6, 1.2], 44.0, 1100,
                 failed=1, relayed=1)
    rows = _by_name(compare_runs([load_run(a), load_run(b)]))
    assert rows[("pdd", "preflight_rtt_ms")].values == (40.5, 44.0)
    assert rows[("pdd", "wan_ab_bytes")].values == (10000.0, 11000.0)  # counters x k
    assert rows[("pdd", "wan_ab_bytes")].spread == pytest.approx(0.1)
    assert rows[("pdd", "ttft_p50_s")].values == (2.0, 2.2)
    assert rows[("pdd", "kv_wan_s_p50")].values == (0.5, 0.6)
    assert rows[("pdd", "prefill_real_s_p50")].values == (0.05, 0.06)
    assert rows[("pdd", "tpot_p50_ms")].values == (pytest.approx(100.0), pytest.approx(100.0))
    assert rows[("pdd", "rld_token_share")].values == (0.0, pytest.approx(4 / 33))
    assert rows[("pdd", "relayed_share")].values == (0.0, pytest.approx(1 / 3))
    assert rows[("pdd", "requests_completed")].values == (3.0, 3.0)
    assert rows[("pdd", "requests_failed")].values == (0.0, 1.0)
    assert rows[("pdd", "requests_failed")].spread is None  # no ratio to a zero


def test_a_mode_only_one_run_has_is_shown_with_gaps(tmp_path):
    a = _run_dir(tmp_path / "a", "userspace", [1.0], [0.5], 40.0, 10)
    b = _run_dir(tmp_path / "b", "netem", [1.0], [0.5], 40.0, 10)
    (b / "metadata.json").write_text(json.dumps({"backend": "netem", "scale": 10.0,
                                                 "modes": ["pdd", "same-dc-pd"]}))
    (b / "same-dc-pd").mkdir()
    rows = compare_runs([load_run(a), load_run(b)])
    gap = _by_name(rows)[("same-dc-pd", "ttft_p50_s")]
    assert gap.values == (None, None) and gap.spread is None
    table = format_comparison(rows, ["host", "guest"])
    assert table.splitlines()[0].split()[:4] == ["mode", "figure", "host", "guest"]


def test_the_command_names_a_bad_run_directory(tmp_path):
    a = _run_dir(tmp_path / "a", "userspace", [1.0], [0.5], 40.0, 10)
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "compare", str(a),
                        str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "nope: not a run directory" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "compare", str(a), str(a),
                        "--labels", "one"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "1 labels for 2 run directories" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "compare", str(a), str(a)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "a (userspace)" in r.stdout, r.stderr
