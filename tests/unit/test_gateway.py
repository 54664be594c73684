"""The OpenAI-compatible gateway on loopback role processes, driven by the `openai` package.

One cluster (P, RLD, MD, router; relay threshold 0, so requests go
p-rld-md) and one gateway process for the module. Checks: exact tokens
(the gateway's text re-tokenized, and its requests.jsonl through
``verify_records``) for completions and chat, streaming and not; the SSE
framing (one chunk per token, usage, ``[DONE]``); the error bodies; and a
client that disconnects mid-stream: its request is cancelled in the roles
and recorded as failed, and the next request is served.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time

import pytest
from pdd_fixtures import complete_lines, small_config

from testbed.pdd.compute.model import build_model
from testbed.pdd.run.procs import RoleProcesses, free_port, loopback_config
from testbed.pdd.compute.text import encode, load_tokenizer
from testbed.pdd.run.verify import verify_records
from testbed.pdd.wire.protocol import Frame, Health, HealthAck, Hello, Role
from testbed.pdd.wire.transport import TcpTransport

openai = pytest.importorskip("openai")
MODEL = "pdd-tiny"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    cfg = loopback_config(small_config("pdd", "catch-up", router={"relay_threshold_s": 0.0},
                                       timing={"connect_timeout_s": 20.0},
                                       client={"request_timeout_s": 20.0,
                                               "report_grace_s": 1.0}))
    run_dir = tmp_path_factory.mktemp("gateway")
    with RoleProcesses(cfg, run_dir) as procs:
        procs.start()
        port = free_port()
        procs.start_gateway("client", port, run_dir / "requests.jsonl")
        procs.port = port
        procs.openai = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                     max_retries=0, timeout=30)
        yield procs


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def ref(gw):
    model = build_model(gw.cfg.model)
    return lambda ids, n: model.greedy_generate(list(ids), n)


def _records(gw, n: int, timeout_s: float = 10.0) -> list[dict]:
    """The first ``n`` lines of the gateway's requests.jsonl (waiting for them)."""
    path, deadline = gw.run_dir / "requests.jsonl", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = complete_lines(path)
        if len(lines) >= n:
            return [json.loads(x) for x in lines]
        time.sleep(0.05)
    raise AssertionError(f"{len(lines)} records after {timeout_s} s, expected {n}")


def _record_of(gw, x_request_id: str, timeout_s: float = 10.0) -> dict:
    """The record of the request sent with that ``X-Request-ID`` (waiting for it): found by
    its id, not by its place in the file, since a request's record follows its REPORTs and
    may land after those of requests that ended later."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for rec in _records(gw, 0):
            if rec["gateway"].get("x_request_id") == x_request_id:
                return rec
        time.sleep(0.05)
    raise AssertionError(f"no record of X-Request-ID {x_request_id} after {timeout_s} s")


def _post(gw, path: str, body: bytes, method: str = "POST") -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    conn.request(method, path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


PROMPT = "The quick brown fox jumps over the lazy dog, then naps: ZZZ... (¡olé!)\n"


def test_completions_streaming_and_not_give_the_greedy_tokens(gw, tok, ref):
    ids = encode(tok, PROMPT)
    want = ref(ids, 40)
    whole = gw.openai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40,
                                         temperature=0, extra_body={"ignore_eos": True},
                                         extra_headers={"X-Request-ID": "whole-1"})
    assert encode(tok, whole.choices[0].text) == want
    assert whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(ids), 40)
    chunks = list(gw.openai.completions.create(model=MODEL, prompt=ids, max_tokens=40,
                                               temperature=0, stream=True,
                                               stream_options={"include_usage": True}))
    assert len(chunks) == 41  # one per token, then usage
    assert [encode(tok, c.choices[0].text) for c in chunks[:-1]] == [[t] for t in want]
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * 39 + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40


def test_chat_streaming_and_not_give_the_greedy_tokens(gw, tok, ref):
    messages = [{"role": "system", "content": "terse"}, {"role": "user", "content": "Hi!"}]
    want = ref(encode(tok, "system: terse\nuser: Hi!\nassistant: "), 24)
    whole = gw.openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                              temperature=0)
    assert encode(tok, whole.choices[0].message.content) == want
    chunks = list(gw.openai.chat.completions.create(model=MODEL, messages=messages,
                                                    max_completion_tokens=24, temperature=0,
                                                    stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert encode(tok, "".join(c.choices[0].delta.content for c in chunks)) == want


def test_the_raw_stream_is_one_event_per_token_then_done(gw):
    body = json.dumps({"model": MODEL, "prompt": [7] * 30, "max_tokens": 5, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json",
                                                    "X-Request-ID": "raw-stream-1"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    assert resp.getheader("X-Request-ID") == "raw-stream-1"  # echoed, and in the record
    events = resp.read().decode().split("\n\n")
    conn.close()
    assert events[-2:] == ["data: [DONE]", ""] and len(events) == 7
    assert all(json.loads(e[len("data: "):])["object"] == "text_completion"
               for e in events[:5])


def test_models_and_health(gw):
    assert [m.id for m in gw.openai.models.list().data] == [MODEL]
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    conn.close()


@pytest.mark.parametrize("body,status,param,code", [
    (b'{"model": "pdd-tiny", "prompt": "hi", ', 400, None, None),  # malformed JSON
    (b'{"prompt": "hi", "max_tokens": "8"}', 400, "max_tokens", None),
    (b'{"prompt": "", "max_tokens": 8}', 400, "prompt", None),
    (b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens", None),
    (json.dumps({"prompt": [1] * 4090, "max_tokens": 10}).encode(), 400, "max_tokens",
     "context_length_exceeded"),
    (b'{"model": "llama", "prompt": "hi"}', 404, "model", "model_not_found"),
    (b'{"prompt": "hi", "temperature": 0.8}', 400, "temperature", None),
])
def test_bad_requests_get_openai_error_bodies(gw, body, status, param, code):
    got, answer = _post(gw, "/v1/completions", body)
    assert got == status
    assert (answer["error"]["param"], answer["error"]["code"]) == (param, code)
    assert answer["error"]["message"]


def test_the_openai_client_raises_the_matching_errors(gw):
    with pytest.raises(openai.NotFoundError):
        gw.openai.completions.create(model="llama", prompt="hi", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="greedily"):
        gw.openai.chat.completions.create(model=MODEL, temperature=1.0, max_tokens=4,
                                          messages=[{"role": "user", "content": "x"}])
    assert _post(gw, "/v1/nothing", b"{}")[0] == 404
    assert _post(gw, "/v1/completions", b"", "GET")[0] == 405


def test_a_client_gone_mid_stream_cancels_its_request(gw, tok, ref):
    body = json.dumps({"model": MODEL, "prompt": "cancel me " * 8, "max_tokens": 600,
                       "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-ID: cancel-1\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += s.recv(4096)
    rec = _record_of(gw, "cancel-1")
    assert (rec["status"], rec["reason"]) == ("failed", "client disconnected")
    assert 3 <= len(rec["tokens"]) < 300  # 600 tokens take >= 5 s: it stopped early
    assert rec["gateway"]["abandoned"] == "client disconnected"
    # every role REPORTed, MD (which decodes to the end) too: CANCEL reached them all
    assert set(rec["reports"]) == {"router", "P", "RLD", "MD"}
    assert rec["reports"]["MD"]["cancelled"] is True  # freed by the CANCEL, not by its end
    # and nothing of it is left: the decoders hold no sequence and no request state (a
    # role frees a request before it REPORTs it, so this holds once the record is in)
    assert _decoder_loads(gw) == {"rld0": (0, 0), "md0": (0, 0)}
    # the next request is served as usual
    again = gw.openai.completions.create(model=MODEL, prompt="after", max_tokens=8)
    assert encode(tok, again.choices[0].text) == ref(encode(tok, "after"), 8)


def _decoder_loads(gw) -> dict[str, tuple[int, int]]:
    """Each decoder's (sequences decoding, requests held), asked as the router asks:
    HEALTH on a connection of its own, answered by HEALTH_ACK."""
    async def ask(inst) -> tuple[int, int]:
        conn = await TcpTransport().connect(inst.host, inst.port)
        try:
            await conn.send(Frame(0, Hello(Role.ROUTER, "health-probe")))
            await conn.send(Frame(0, Health(7)))
            ack = (await asyncio.wait_for(conn.recv(), 10)).message
            assert isinstance(ack, HealthAck) and ack.nonce == 7
            return ack.active_requests, ack.waiting_requests
        finally:
            conn.close()

    async def all_of() -> dict[str, tuple[int, int]]:
        return {i.name: await ask(i) for role in (Role.RELAY_DECODE, Role.MAIN_DECODE)
                for i in gw.cfg.of_role(role)}
    return asyncio.run(all_of())


def test_bad_requests_do_not_disturb_a_stream_in_flight(gw, tok, ref):
    body = json.dumps({"model": MODEL, "prompt": "steady", "max_tokens": 120,
                       "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        got = s.recv(4096)
        for bad in (b"{not json", b'{"model": "x", "prompt": "a"}', b'{"prompt": [9999]}'):
            assert _post(gw, "/v1/completions", bad)[0] in (400, 404)
        while b"data: [DONE]" not in got:
            got += s.recv(65536)
    head, _, sse = got.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0]
    texts = [json.loads(line[len(b"data: "):])["choices"][0]["text"]
             for line in _sse_lines(sse) if line != b"data: [DONE]"]
    assert encode(tok, "".join(texts)) == ref(encode(tok, "steady"), 120)


@pytest.mark.parametrize("value, kept", [("044c6fd4-cceb", "044c6fd4-cceb"),
                                         ("x" * 128, "x" * 128), ("x" * 129, None),
                                         ("", None), ("a\tb", None), ("caf\u00e9", None)])
def test_only_a_short_printable_x_request_id_is_kept(value, kept):
    from aiohttp.test_utils import make_mocked_request

    from testbed.pdd.roles.gateway import request_id

    req = make_mocked_request("POST", "/v1/completions", headers={"X-Request-ID": value})
    assert request_id(req) == kept
    assert request_id(make_mocked_request("POST", "/v1/completions")) is None


def _sse_lines(body: bytes) -> list[bytes]:
    """The ``data:`` lines of a chunked (HTTP/1.1) event stream."""
    return [line for line in body.split(b"\n") if line.startswith(b"data: ")]


def test_every_served_request_is_recorded_and_verifies(gw):
    """Last in the module: the records of all the requests above."""
    recs = _records(gw, 8)  # 2 completions, 2 chat, 1 raw stream, 1 cancelled, 1 after
    # it, 1 beside bad requests
    done = [r for r in recs if r["status"] == "completed"]
    assert len(done) == len(recs) - 1  # only the disconnected one failed
    assert all(r["pipeline"] == "p-rld-md" for r in done)
    assert all(r["gateway"]["http_status"] == 200 for r in done)
    ids = [r["gateway"]["x_request_id"] for r in recs]  # the X-Request-ID headers sent
    assert sorted(x for x in ids if x is not None) == ["cancel-1", "raw-stream-1", "whole-1"]
    verdicts = verify_records(recs, gw.cfg.model)
    assert all(v.prefix_ok for v in verdicts)
    assert all(v.match for v in verdicts if v.status == "completed")
