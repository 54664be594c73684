"""End to end (root): ``testbed serve`` and ``testbed exec`` on real namespaces, with the
official ``openai`` package as the external client inside the emulated client host.

Each test checks the chain client text -> the gateway's records -> the greedy decode
(serve's verify.json) request by request, the refused requests' error bodies, and that
the run left nothing behind. The heavy clients (AIPerf, GuideLLM) are `testbed bench
clients`, not CI.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.pdd.compute.text import encode, load_tokenizer
from tests.net.conftest import needs_root, netns_list, root_links, state_files

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).with_name("openai_client.py")
pytestmark = [needs_root, pytest.mark.root]
pytest.importorskip("openai")


@pytest.fixture
def nothing_left():
    before = (root_links(), state_files(), netns_list())
    yield
    assert root_links() <= before[0], f"left: {root_links() - before[0]}"
    assert state_files() <= before[1] and netns_list() <= before[2]


def cli(*args, timeout=600, **kw):
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, **kw)


def check_run(out: Path, client_json: Path) -> None:
    """What the client received is what the roles delivered, and that is greedy decode."""
    got = json.loads(client_json.read_text())
    assert got["problems"] == []
    assert [(e["status"], e["body"]["code"]) for e in got["errors"]] == [
        (400, None), (404, "model_not_found")]
    assert [e["body"]["param"] for e in got["errors"]] == ["max_tokens", "model"]
    records = sorted((json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()),
                     key=lambda r: r["id"])
    assert [r["status"] for r in records] == ["completed"] * 3  # the refused are not records
    tok = load_tokenizer()
    for text, rec in zip(got["texts"], records):
        assert encode(tok, text) == [t[1] for t in sorted(rec["tokens"])]
    verify = json.loads((out / "verify.json").read_text())
    assert verify["checked"] == 3 and verify["mismatched"] == []
    stats = json.loads((out / "gateway-stats.json").read_text())
    assert (stats["requests"], stats["completed"], stats["verified"]) == (3, 3, 3)


def test_serve_runs_an_openai_client_in_the_client_host(tmp_path, nothing_left):
    out = tmp_path / "serve"
    r = cli("serve", "topologies/two-dc.yaml", "--mode", "pdd", "--out", str(out), "--",
            sys.executable, str(CLIENT), "{base_url}", "{model}", "{out}/client.json")
    assert r.returncode == 0, r.stdout + r.stderr
    check_run(out, out / "client.json")
    stats = json.loads((out / "gateway-stats.json").read_text())
    assert stats["client_exit"] == 0 and stats["command"][1] == str(CLIENT)


def test_exec_runs_a_client_in_a_live_serve_and_ctrl_c_stops_it(tmp_path, nothing_left):
    out = tmp_path / "live"
    serve = subprocess.Popen([sys.executable, "-m", "testbed.cli", "serve", "--mode",
                              "cross-dc-pd", "--out", str(out)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "serve.json").exists():
            assert serve.poll() is None, serve.communicate()
            assert time.monotonic() < deadline, "serve did not come up in 300 s"
            time.sleep(0.5)
        info = json.loads((out / "serve.json").read_text())
        r = cli("exec", "client", "--prefix", info["prefix"], "--", sys.executable,
                str(CLIENT), info["url"], info["model"], str(tmp_path / "client.json"))
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        serve.send_signal(signal.SIGINT)
        so, se = serve.communicate(timeout=300)
    assert serve.returncode == 0, so + se
    check_run(out, tmp_path / "client.json")
