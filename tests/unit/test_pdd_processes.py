"""Each role as its own OS process on loopback TCP (``python -m testbed.pdd.run.node``).

One cluster for the module: a malformed frame sent to a role closes that
connection only, and a small ``pdd`` workload then completes with exact
tokens; SIGTERM stops every role cleanly (exit 0).
"""

from __future__ import annotations

import json
import random
import socket

import pytest
from pdd_fixtures import small_config

from testbed.pdd.run.procs import RoleProcesses, loopback_config
from testbed.pdd.run.verify import verify_records


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    # relay_threshold 0: every non-anomalous request is relayed (p-rld-md)
    cfg = loopback_config(small_config("pdd", "catch-up", router={"relay_threshold_s": 0.0},
                                       timing={"connect_timeout_s": 20.0}))
    with RoleProcesses(cfg, tmp_path_factory.mktemp("pdd-procs")) as procs:
        procs.start()
        yield procs


def _send_garbage(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(64))
        s.settimeout(10)
        return s.recv(100)  # b"" once the role closed this connection


@pytest.mark.parametrize("name", ["p0", "router"])
def test_a_malformed_frame_closes_only_that_connection(procs, name):
    inst = procs.cfg.instance(name)
    assert _send_garbage(inst.host, inst.port) == b""
    assert procs.procs[name].poll() is None  # the role is still running
    assert "protocol error" in (procs.run_dir / f"{name}.log").read_text()


def test_a_workload_over_tcp_processes_completes_with_exact_tokens(procs):
    rng = random.Random(11)
    requests = [{"id": i, "arrival_s": 0.05 * i, "max_out": 40, "session": i,
                 "prompt": [rng.randrange(512) for _ in range(64 + 32 * i)]} for i in range(3)]
    workload, out = procs.run_dir / "workload.jsonl", procs.run_dir / "requests.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in requests))
    assert procs.run_client("client", workload, out).returncode == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in records] == ["completed"] * 3, [r["reason"] for r in records]
    assert all(r["pipeline"] == "p-rld-md" for r in records)
    assert all(v.match for v in verify_records(records, procs.cfg.model))


def test_the_router_hears_ps_tcp_counters_of_its_kv_to_md(procs):
    """P reports the segments its connections to MD sent and retransmitted (TCP_INFO),
    and the router's decision records carry the window's count and share: segments
    of the first requests' KV (sent well over one status interval before the last is
    routed), none of them retransmitted on loopback."""
    rng = random.Random(13)
    requests = [{"id": i, "arrival_s": 0.4 * i, "max_out": 20, "session": 100 + i,
                 "prompt": [rng.randrange(512) for _ in range(64)]} for i in range(3)]
    workload, out = procs.run_dir / "tcp.jsonl", procs.run_dir / "tcp-requests.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in requests))
    assert procs.run_client("client", workload, out).returncode == 0
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    last = records[2]["reports"]["router"]
    assert last["wan_retrans_segments"] > 0 and last["wan_retrans_share"] == 0.0, last
    assert last["wan_rto_s"] >= 0.2  # Linux's minimum retransmission timeout


def test_warmup_requests_run_first_go_p_md_and_fill_mds_drc(procs):
    """The client replays warm-up lines before "ready" (records in warmup.jsonl, not in
    requests.jsonl); a warm-up goes p-md even where the router would relay, so the
    measured request that shares its prompt finds it in MD's DRC."""
    rng = random.Random(12)
    system = [rng.randrange(512) for _ in range(96)]  # + 32: under the anomalous length
    requests = [{"id": 1, "arrival_s": 0.0, "max_out": 60, "session": 1,
                 "prompt": system + [rng.randrange(512) for _ in range(32)]},
                {"id": 0, "arrival_s": 0.0, "max_out": 8, "session": 0, "prompt": system,
                 "warmup": True}]
    workload, out = procs.run_dir / "warm.jsonl", procs.run_dir / "warm-requests.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in requests))
    assert procs.run_client("client", workload, out).returncode == 0
    warm = [json.loads(line) for line in (procs.run_dir / "warmup.jsonl").read_text().splitlines()]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["status"], r["pipeline"]) for r in warm] == [(0, "completed", "p-md")]
    assert [r["id"] for r in records] == [1] and records[0]["status"] == "completed"
    assert records[0]["pipeline"] == "p-rld-md", records[0]["reports"]["router"]["reason"]
    assert records[0]["md_hit_rate"] == pytest.approx(96 / 128)
    assert all(v.match for v in verify_records(warm + records, procs.cfg.model))


def test_sigterm_stops_every_role_cleanly(procs):
    assert procs.stop() == {"p0": 0, "rld0": 0, "md0": 0, "router": 0}


def test_warmup_problems_name_each_bad_warmup_request():
    from testbed.pdd.roles.client import warmup_problems

    ok = {"id": 1, "status": "completed", "reason": None, "tokens_lost": 0,
          "tokens_duplicated": 0}
    failed = dict(ok, id=2, status="failed", reason="timeout after 20 s")
    lossy = dict(ok, id=3, tokens_lost=2)
    assert warmup_problems([ok]) == []
    assert warmup_problems([ok, failed, lossy]) == [
        "warm-up request 2: failed (timeout after 20 s)",
        "warm-up request 3: 2 tokens lost, 0 duplicated"]
