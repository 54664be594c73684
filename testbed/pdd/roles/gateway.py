"""The OpenAI-compatible front end: its own process, a client of the router in DC A.

``python -m testbed.pdd.roles.gateway CONFIG.json NAME --port 8000 --out requests.jsonl``
serves, on aiohttp:

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: validated by
  ``openai_api``; the prompt (text through the tiny model's tokenizer,
  ``testbed.pdd.compute.text``, or token ids) goes to the router as a REQUEST over
  ``gateway_link.RouterLink``. ``stream: true`` answers with server-sent
  events: one ``data:`` chunk per token (its one character as
  ``choices[0].text``, chat: ``delta.content``; the last token's chunk has
  ``finish_reason``), a ``usage`` chunk when ``stream_options.include_usage``,
  then ``data: [DONE]``. Otherwise one JSON answer with ``usage``.
- ``GET /v1/models`` (the one served model) and ``GET /health`` (200 while
  the router connection is up, else 503).

Errors are OpenAI-style bodies (``testbed.errors.ApiError``): 400 for a bad
body, 404 for an unknown model or path, 405, 413 for a body over 4 MiB,
429 with ``Retry-After`` when admission refuses it or a role refused it as
overloaded (ERROR OVERLOADED) before its first token, 503 when the router is
unreachable or a role failed before the first token, 504 on the request
timeout. Admission (``admission.py``) happens before the body is read:
``client.max_open_requests`` requests are open at once; the next ones wait,
first come first admitted, up to ``client.max_queued_requests`` of them for
up to ``client.queue_timeout_s`` each (each wait drawn from half that to
it); one beyond the queue, or whose wait ran out, is answered 429. A queued
request's body is neither parsed nor tokenized (aiohttp buffers at most
~128 KiB of it, twice its 64 KiB read limit, and leaves the rest in the
socket). A slot is freed once every role's REPORT for its request is in,
i.e. once the router let it go (a relayed request's WAN transfer may go on
after its DONE), so the router does not hold more than the gateway admits;
at the latest ``request_timeout_s`` after the request's record. A refused
request is recorded too (``failed``, its reason, ``gateway.http_status``
429, no prompt: it was never read), as is one whose client left while it
was queued; an admitted one's record says how long it was queued
(``gateway.queued_s``; its TTFT counts from arrival, the wait included).
A failure after the first streamed token is a
``data: {"error": ...}`` event and the stream ends without ``[DONE]``.
The HTTP headers of a stream are sent with its first token, so a failure
before it still gets its status code. A stream writes a token only when its
reader has taken the ones before (aiohttp's write waits while the socket's
buffers are full), so a reader that stops reading holds its request open
(under the admission limit and ``request_timeout_s``) but not the gateway's
memory: what waits is that request's own token list and what the socket's
buffers took (up to ~140 KB of events per stream on loopback here:
tests/unit/test_gateway_slow_readers.py). The record's gateway object says
how many tokens were handed to the HTTP side (``tokens_written``) and
whether the HTTP client went away before its handler ended
(``client_disconnected``): the roles may have completed a request whose
reader never took it all.

A client that disconnects (mid-stream or while waiting) cancels its
handler (aiohttp ``handler_cancellation``); the gateway then sends CANCEL
for that request, and its record says ``failed`` / "client disconnected".
NAME is a client instance of the config; every request is a line of
``--out`` in the client's requests.jsonl format (``gateway_link``), so
``python -m testbed.pdd.run.verify OUT CONFIG`` checks its tokens. With
``--stats FILE`` it appends a role's probe snapshots to FILE every second
(testbed/pdd/run/probe.py: its event loop's lag, the garbage collector's
pauses, its memory and descriptors): what its ``/health`` latency is made
of under load. What it loaded before serving (modules, tokenizer, the token
pieces) is frozen out of the collector's traversals, as in a role process,
so a full collection scans only the requests' own objects. Prints
``ready`` once it serves; SIGTERM/SIGINT stop it (open requests are
cancelled and recorded) with exit 0. Exit 2: bad config or arguments;
1: the router could not be reached at start.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import math
import signal
import sys
import time

from aiohttp import web

from testbed import clock
from testbed.errors import ApiError, SpecError, TestbedError
from testbed.pdd.roles import openai_api as api
from testbed.pdd.roles.admission import Admission, Overloaded
from testbed.pdd.run.config import ClusterConfig, load_config
from testbed.pdd.run.probe import RoleProbe
from testbed.pdd.run.sched import prefer_front_end
from testbed.pdd.roles.gateway_link import Live, RouterLink
from testbed.pdd.compute.text import TOKENIZER_DIR, decode_one_each, encode, load_tokenizer
from testbed.pdd.wire.transport import ConnectionClosed, TcpTransport
from testbed.pdd.wire.fields import Role
from testbed.strict import parse_json

log = logging.getLogger(__name__)

DEFAULT_MODEL = "pdd-tiny"
MAX_BODY_BYTES = 4 << 20
_DONE = b"data: [DONE]\n\n"


def request_id(request: web.Request) -> str | None:
    """The client's ``X-Request-ID`` header (AIPerf sends one per request), kept in the
    record and echoed in the response so a client's own export can be matched to the
    gateway's records exactly; None when absent or not 1-128 printable ASCII characters."""
    value = request.headers.get("X-Request-ID")
    if value and len(value) <= 128 and value.isascii() and value.isprintable():
        return value
    return None


def _echo(live: Live) -> dict[str, str]:
    rid = live.info.get("x_request_id")
    return {} if rid is None else {"X-Request-ID": rid}


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@web.middleware
async def _errors(request: web.Request, handler):
    """ApiError and aiohttp's own HTTP errors (404, 405, 413) as OpenAI error bodies."""
    try:
        return await handler(request)
    except ApiError as err:
        return web.json_response(err.body(), status=err.status, headers=err.headers)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        kind = "invalid_request_error" if err.status < 500 else "server_error"
        body = ApiError(err.status, f"{err.reason}: {request.method} {request.path}",
                        type=kind).body()
        return web.json_response(body, status=err.status)


class Gateway:
    """The HTTP handlers over one RouterLink (see the module docstring)."""

    def __init__(self, cfg: ClusterConfig, link: RouterLink, tokenizer, model: str):
        self.cfg, self.link = cfg, link
        self.served = api.Served(model, cfg.model.vocab_size, cfg.model.max_context,
                                 int(time.time()))
        self._tok = tokenizer
        self._pieces = decode_one_each(tokenizer, range(cfg.model.vocab_size))
        c = cfg.client
        limit = c.max_open_requests or cfg.limits.max_requests
        self.admission = Admission(limit, c.max_queued_requests or limit, c.queue_timeout_s)
        self.stopping = False  # set before the handlers are cancelled at shutdown

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
        app.add_routes([web.post("/v1/completions", self.completions),
                        web.post("/v1/chat/completions", self.chat),
                        web.get("/v1/models", self.models), web.get("/health", self.health)])
        return app

    async def health(self, request: web.Request) -> web.Response:
        if self.link.connected:
            return web.json_response({"status": "ok"})
        raise ApiError(503, "the router connection is down", type="server_error",
                       code="router_unavailable")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(api.models_body(self.served))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, api.parse_completion, "completions")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, api.parse_chat, "chat")

    async def _body(self, request: web.Request) -> object:
        raw = await request.read()
        try:
            return parse_json(raw.decode("utf-8"), "request body", "", "a JSON document")
        except UnicodeDecodeError:
            raise ApiError(400, "the request body is not UTF-8") from None
        except SpecError as err:
            raise ApiError(400, f"the request body is not valid JSON ({err})") from None

    def _overloaded(self, why: str) -> ApiError:
        retry = self.cfg.client.retry_after_s
        return ApiError(429, f"overloaded: {why}; retry after {retry:g} s", type="server_error",
                        code="overloaded", headers={"Retry-After": f"{math.ceil(retry):d}"})

    async def _generate(self, request: web.Request, parse, what: str) -> web.StreamResponse:
        t_received = clock.now()
        refused = {"api": what, "stream": None, "ttft_http_s": None, "http_status": 429,
                   "x_request_id": request_id(request)}
        try:  # before the body is read: a queued or refused request costs its socket only
            queued_s = await self.admission.enter()
        except Overloaded as err:
            self.link.refuse((), 0, None, refused, t_received, f"refused by the gateway: {err}")
            raise self._overloaded(str(err))
        except asyncio.CancelledError:
            why = "the gateway stopped" if self.stopping else "the client disconnected"
            self.link.refuse((), 0, None, dict(refused, http_status=None,
                                                client_disconnected=not self.stopping),
                             t_received, f"{why} while queued for admission")
            raise
        try:
            gen = parse(await self._body(request), self.served, lambda t: encode(self._tok, t))
            info = {"api": what, "stream": gen.stream, "ttft_http_s": None, "http_status": None,
                    "x_request_id": request_id(request), "tokens_written": 0,
                    "queued_s": round(queued_s, 6)}
            live = await self.link.open(gen.prompt_ids, gen.max_tokens, gen.session, info,
                                        t_received)
        except BaseException:  # a bad body, the router unreachable, the client gone
            self.admission.leave()
            raise
        return await self._admitted(request, gen, live)

    async def _admitted(self, request: web.Request, gen: api.Generate,
                        live: Live) -> web.StreamResponse:
        """Serve an admitted request sent to the router; its slot is freed once the
        roles' REPORTs say they let it go (``RouterLink.finish``)."""
        info = live.info
        deadline = asyncio.get_running_loop().time() + self.cfg.client.request_timeout_s
        try:
            if gen.stream:
                resp = await self._stream(request, gen, live, deadline)
            else:
                resp = await self._whole(gen, live, deadline)
            info["http_status"] = resp.status
            return resp
        except ApiError as err:
            info["http_status"] = err.status
            raise
        except (asyncio.CancelledError, ConnectionResetError):  # the HTTP client went away:
            info["client_disconnected"] = True  # aiohttp cancels us, or a write to its
            raise                               # closing socket fails first
        finally:  # a cancelled handler (client gone) lands here too
            self.link.finish(live, on_released=self.admission.leave)

    def _failure(self, live: Live) -> ApiError | None:
        """Why ``live`` ended without all its tokens, as an HTTP error; None if it did not."""
        tr = live.trace
        if tr.failure is not None:
            if tr.error_code == "OVERLOADED" and live.next_pos == 0:
                return self._overloaded(f"the roles refused it: {tr.failure}")
            if tr.failure.startswith("timeout"):
                return ApiError(504, f"request timed out: {tr.failure}", type="server_error",
                                code="timeout")
            return ApiError(503, f"the request failed in the roles: {tr.failure}",
                            type="server_error", code="backend_failed")
        if live.next_pos < tr.req.max_out:
            return ApiError(500, f"the roles ended the request after {live.next_pos} of "
                            f"{tr.req.max_out} tokens", type="server_error", code="tokens_lost")
        return None

    async def _whole(self, gen: api.Generate, live: Live, deadline: float) -> web.Response:
        ids: list[int] = []
        while more := await self.link.next_ids(live, deadline):
            if not ids:
                live.info["ttft_http_s"] = round(clock.now() - live.t_received, 6)
            ids += more
        if (err := self._failure(live)) is not None:
            raise err
        text = "".join(self._pieces[i] for i in ids)
        body = api.response_body(gen, live.info["id"], self.served.created, text, len(ids),
                                 "length")
        live.info["tokens_written"] = len(ids)  # handed to aiohttp with the response
        return web.json_response(body, headers=_echo(live))

    async def _stream(self, request: web.Request, gen: api.Generate, live: Live,
                      deadline: float) -> web.StreamResponse:
        rid, created, n = live.info["id"], self.served.created, gen.max_tokens
        resp = None
        while more := await self.link.next_ids(live, deadline):
            if resp is None:  # headers with the first token: an earlier failure keeps its status
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache", **_echo(live)})
                await resp.prepare(request)
            first = live.next_pos - len(more)
            chunks = [_sse(api.chunk_body(gen, rid, created, self._pieces[tok],
                                          "length" if pos == n - 1 else None, pos == 0))
                      for pos, tok in enumerate(more, first)]
            for chunk in chunks:  # a reader that does not read holds us here (back-pressure)
                await resp.write(chunk)
                live.info["tokens_written"] += 1
            if first == 0:
                live.info["ttft_http_s"] = round(clock.now() - live.t_received, 6)
        err = self._failure(live)
        if resp is None:
            if err is not None:
                raise err
            raise ApiError(500, "the request ended without tokens", type="server_error")
        if err is not None:
            await resp.write(_sse(err.body()))
        else:
            if gen.include_usage:
                await resp.write(_sse(api.usage_chunk(gen, rid, created, live.next_pos)))
            await resp.write(_DONE)
        await resp.write_eof()
        return resp


async def serve(cfg: ClusterConfig, name: str, host: str, port: int, out: str,
                tokenizer_path: str, model: str, stats: str | None = None,
                sched: dict | None = None) -> None:
    """Run the gateway until SIGTERM/SIGINT (see the module docstring)."""
    tok = load_tokenizer(tokenizer_path, cfg.model.vocab_size)
    link = RouterLink(cfg, name, TcpTransport(), out)
    gateway = Gateway(cfg, link, tok, model)
    runner = web.AppRunner(gateway.app(), handler_cancellation=True,
                           access_log=None)
    gc.freeze()
    # fewer, larger young collections (every 10,000 allocations, not 700): with ~1000 open
    # streams a collection took up to 70 ms under AIPerf at concurrency 1024 with the
    # defaults (the probe's gc_pause), and /health was late 16 times in a run, not 6
    gc.set_threshold(10_000, 10, 10)
    probe = RoleProbe(stats, name, "gateway", sched=sched) if stats else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await link.connect()
        await runner.setup()
        await web.TCPSite(runner, host, port, shutdown_timeout=1.0).start()
        if probe is not None:
            probe.start()
        print("ready", flush=True)
        log.warning("serving http://%s:%d/v1 (model %s), records in %s", host, port, model, out)
        await stop.wait()
    finally:
        if probe is not None:
            await probe.stop()
        gateway.stopping = True
        await runner.cleanup()
        await link.close()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m testbed.pdd.roles.gateway",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("config", help="cluster config JSON")
    ap.add_argument("name", help="this gateway's client instance name in the config")
    ap.add_argument("--host", help="HTTP address (default: the instance's host)")
    ap.add_argument("--port", type=int, default=8000, help="HTTP port")
    ap.add_argument("--out", required=True, help="requests.jsonl to append every request to")
    ap.add_argument("--tokenizer", default=str(TOKENIZER_DIR),
                    help="tokenizer directory or tokenizer.json")
    ap.add_argument("--model-name", default=DEFAULT_MODEL, help="the served model's name")
    ap.add_argument("--stats", help="append the process's probe snapshots (loop lag, gc "
                    "pauses, memory, descriptors) to this JSONL file every second")
    ap.add_argument("--log-level", default="WARNING")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config)
        inst = cfg.instance(args.name)
        if inst.role != Role.CLIENT:
            raise TestbedError(f"instance {args.name!r} is a {inst.role.name.lower()}, "
                               "not a client")
        load_tokenizer(args.tokenizer, cfg.model.vocab_size)
    except (TestbedError, KeyError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # the front end's scheduling (SCHED_RR 1 as root, else the client role's short slice
    # and nice -10: testbed/pdd/run/sched.py), so that a benchmark client on the same
    # cores does not keep the gateway's one loop waiting for a core
    sched = prefer_front_end()
    try:
        asyncio.run(serve(cfg, args.name, args.host or inst.host, args.port, args.out,
                          args.tokenizer, args.model_name, args.stats, sched))
    except (ConnectionClosed, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
