"""The gateway's admission on loopback role processes: with
``client.max_open_requests`` requests open the next ones wait in the bounded queue
(``client.max_queued_requests``, ``client.queue_timeout_s``); one beyond the queue is
answered 429 with Retry-After at once, one whose wait ran out gets 429 after it, one
whose turn came is served (its record says how long it was queued); every refused
request is recorded as failed with its reason; health answers meanwhile; the router
never sees a refused request. The queue's own logic: test_admission.py."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from pdd_fixtures import complete_lines, small_config

from testbed.pdd.run.procs import RoleProcesses, free_port, loopback_config


QUEUE_S = 2.0
# 1500 tokens take >= 7 s of modeled decode (time_scale 0.5): they hold both slots
# well past a queued request's QUEUE_S of waiting
LONG = 1500


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    cfg = loopback_config(small_config("pdd", "catch-up", router={"relay_threshold_s": 0.0},
                                       timing={"connect_timeout_s": 20.0},
                                       client={"request_timeout_s": 30.0, "report_grace_s": 1.0,
                                               "max_open_requests": 2, "max_queued_requests": 1,
                                               "queue_timeout_s": QUEUE_S,
                                               "retry_after_s": 2.5}))
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


BODY = {"model": "pdd-tiny", "prompt": list(range(1, 97)), "max_tokens": LONG}
SHORT = dict(BODY, max_tokens=4)


def _records(gw) -> list[dict]:
    return [json.loads(x) for x in complete_lines(gw.run_dir / "requests.jsonl")]


def _records_since(gw, n0: int, n: int, timeout_s: float = 10.0) -> list[dict]:
    """The records after the first ``n0``, once there are ``n`` of them (a record follows
    its request's REPORTs, so it may land a moment after the response)."""
    deadline = time.monotonic() + timeout_s
    while len(_records(gw)) < n0 + n and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # and nothing more than expected comes
    return _records(gw)[n0:]


def _in_thread(fn, *args):
    out = {}

    def run():
        t0 = time.monotonic()
        out["result"] = fn(*args)
        out["seconds"] = time.monotonic() - t0

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_beyond_the_queue_429_at_once_a_wait_that_runs_out_429_after_it(gw):
    n0 = len(_records(gw)) if (gw.run_dir / "requests.jsonl").exists() else 0
    longs = [_in_thread(_request, gw, "/v1/completions", BODY) for _ in range(2)]
    time.sleep(1.0)  # both admitted and decoding
    queued, queued_out = _in_thread(_request, gw, "/v1/completions", SHORT)
    time.sleep(0.3)  # it waits in the queue (of 1)
    t0 = time.monotonic()
    status, headers, body = _request(gw, "/v1/completions", SHORT)
    refused_in = time.monotonic() - t0
    h0 = time.monotonic()
    health = _request(gw, "/health")[0]
    health_in = time.monotonic() - h0
    queued.join(60)
    for t, _ in longs:
        t.join(60)
    print(f"429 in {refused_in * 1e3:.1f} ms, health in {health_in * 1e3:.1f} ms, "
          f"queued one answered after {queued_out['seconds']:.2f} s")
    assert status == 429 and headers["Retry-After"] == "3"  # 2.5 s, rounded up
    assert body["error"]["code"] == "overloaded"
    assert ("2 requests open (client.max_open_requests 2), 1 queued "
            "(client.max_queued_requests 1)") in body["error"]["message"]
    assert refused_in < QUEUE_S / 2  # not queued: the queue was full
    q_status, _, q_body = queued_out["result"]
    assert q_status == 429 and "s in the admission queue (client.queue_timeout_s 2," in (
        q_body["error"]["message"])
    assert queued_out["seconds"] >= QUEUE_S / 2  # its wait was drawn from [1 s, 2 s]
    assert health == 200 and [o["result"][0] for _, o in longs] == [200, 200]
    assert _request(gw, "/v1/completions", SHORT)[0] == 200  # room again
    recs = _records_since(gw, n0, 5)
    refused = [r for r in recs if r["gateway"]["http_status"] == 429]
    assert len(recs) == 5 and len(refused) == 2
    assert all(r["status"] == "failed" and r["reason"].startswith("refused by the gateway: ")
               for r in refused)
    assert [r["status"] for r in recs if r not in refused] == ["completed"] * 3


def _open_stream(gw) -> http.client.HTTPConnection:
    """A streaming request, admitted and under way (its first event read)."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(dict(BODY, stream=True)).encode(),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data: ")
    return conn


def test_a_queued_request_takes_the_slot_a_leaving_one_frees(gw):
    n0 = len(_records(gw))
    streams = [_open_stream(gw) for _ in range(2)]
    queued, out = _in_thread(_request, gw, "/v1/completions", SHORT)
    time.sleep(0.5)
    assert queued.is_alive()  # both slots are taken: it waits
    streams[0].close()  # that client leaves: its handler is cancelled, its slot passes on
    queued.join(60)
    streams[1].close()
    assert out["result"][0] == 200 and out["seconds"] < QUEUE_S
    recs = _records_since(gw, n0, 3)
    served = [r for r in recs if r["gateway"].get("http_status") == 200]
    assert len(recs) == 3 and len(served) == 1 and served[0]["status"] == "completed"
    assert 0.4 <= served[0]["gateway"]["queued_s"] < QUEUE_S
    left = [r for r in recs if r is not served[0]]
    assert all(r["gateway"].get("client_disconnected") for r in left)


def test_a_client_that_leaves_while_queued_is_recorded_and_holds_nothing(gw):
    n0 = len(_records(gw))
    streams = [_open_stream(gw) for _ in range(2)]
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(SHORT).encode(),
                 {"Content-Type": "application/json"})
    time.sleep(0.5)  # queued
    conn.close()  # gone while waiting
    time.sleep(0.3)
    for s in streams:
        s.close()
    assert _request(gw, "/v1/completions", SHORT)[0] == 200  # both slots came back
    assert _request(gw, "/v1/completions", SHORT)[0] == 200
    recs = _records_since(gw, n0, 5)
    left = [r for r in recs if r["reason"] == "the client disconnected while queued for "
            "admission"]
    assert len(recs) == 5 and len(left) == 1
    assert left[0]["status"] == "failed" and left[0]["gateway"]["client_disconnected"]
    assert sum(r["status"] == "completed" for r in recs) == 2
