"""The gateway's admission limit on loopback role processes: with
``client.max_open_requests`` requests open, the next is answered 429 with Retry-After
at once (the router never sees it) and recorded as failed with the reason; health
still answers; once the open ones end, requests are admitted again."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from pdd_fixtures import small_config

from testbed.pdd.run.procs import RoleProcesses, free_port, loopback_config


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    cfg = loopback_config(small_config("pdd", "catch-up", router={"relay_threshold_s": 0.0},
                                       timing={"connect_timeout_s": 20.0},
                                       client={"request_timeout_s": 30.0, "report_grace_s": 1.0,
                                               "max_open_requests": 2, "retry_after_s": 2.5}))
    run_dir = tmp_path_factory.mktemp("gateway-admission")
    with RoleProcesses(cfg, run_dir) as procs:
        procs.start()
        procs.port = free_port()
        procs.start_gateway("client", procs.port, run_dir / "requests.jsonl")
        yield procs


def _request(gw, path: str, body: dict | None = None) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=60)
    conn.request("POST" if body is not None else "GET", path,
                 json.dumps(body).encode() if body is not None else None,
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    status, headers, raw = resp.status, dict(resp.getheaders()), resp.read()
    conn.close()
    return status, headers, json.loads(raw) if raw.startswith(b"{") else {}


BODY = {"model": "pdd-tiny", "prompt": list(range(1, 97)), "max_tokens": 600}


def test_beyond_the_open_limit_a_request_gets_429_at_once_and_is_recorded(gw):
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        _request(gw, "/v1/completions", BODY)[0])) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # both sent and decoding (600 tokens take several seconds)
    t0 = time.monotonic()
    status, headers, body = _request(gw, "/v1/completions", dict(BODY, max_tokens=4))
    refused_in = time.monotonic() - t0
    h0 = time.monotonic()
    health = _request(gw, "/health")[0]
    health_in = time.monotonic() - h0
    for t in threads:
        t.join(60)
    print(f"429 in {refused_in * 1e3:.1f} ms, health in {health_in * 1e3:.1f} ms")
    assert status == 429 and headers["Retry-After"] == "3"  # 2.5 s, rounded up
    assert body["error"]["code"] == "overloaded"
    assert "2 requests open (client.max_open_requests 2)" in body["error"]["message"]
    assert health == 200 and sorted(results) == [200, 200]
    assert _request(gw, "/v1/completions", dict(BODY, max_tokens=4))[0] == 200  # room again
    time.sleep(1.5)  # the records follow the REPORTs
    recs = [json.loads(x) for x in (gw.run_dir / "requests.jsonl").read_text().splitlines()]
    refused = [r for r in recs if r["gateway"]["http_status"] == 429]
    assert len(recs) == 4 and len(refused) == 1
    assert refused[0]["status"] == "failed" and refused[0]["reason"].startswith(
        "refused by the gateway: 2 requests open")
    assert [r["status"] for r in recs if r not in refused] == ["completed"] * 3
