"""Per-byte cost of shipping one prompt's KV from P to RLD: a short microbenchmark.

``python -m testbed.bench.kv_bench [--tokens 2048] [--k 25] [--profile]`` runs,
for one prompt of the default tiny model (float64) at the quickstart's
scale (token_scale 32, 50 KB/token, ``kv_chunk_tokens`` 64):

- ``codec``: P's side (``kv_chunk`` + ``encode_frame_parts`` of every
  KV_CHUNK) and RLD's side (``FrameDecoder.feed`` of the stream in 256 KB
  pieces, as asyncio's socket reads deliver them, + ``decode_kv`` +
  ``KVCache.append``), timed apart, in one thread, no socket;
- ``tcp``: the same frames through a real loopback ``TcpConnection`` (both
  ends in one event loop, so the figure is P's plus RLD's CPU time).

Prints one JSON line per part: the best of ``--repeat`` runs, as wall
seconds and CPU seconds of this process (``time.process_time``: steadier than
wall time on a shared machine), modeled MB and MB per CPU second. Takes a
few seconds; ``--profile`` adds the top cProfile entries of each part.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import time

from testbed.pdd.run.config import TimingConfig
from testbed.pdd.wire.kvpayload import decode_kv, kv_chunk
from testbed.pdd.compute.model import ModelConfig, build_model
from testbed.pdd.wire.protocol import Frame, FrameDecoder, encode_frame_parts, filler_views
from testbed.pdd.wire.transport import TcpTransport

READ_BYTES = 256 * 1024  # asyncio's selector transports read at most this much at once


def _prompt_cache(n_tokens: int):
    cfg = ModelConfig()
    model = build_model(cfg)
    cache = model.new_cache()
    # the KV's values do not matter here: one prefill of a short prompt, tiled
    prompt = [(7 * i + 3) % cfg.vocab_size for i in range(min(n_tokens, 256))]
    _, part = model.prefill(prompt)
    while cache.length < n_tokens:
        take = min(part.length, n_tokens - cache.length)
        seg = part.slice(0, take)
        seg.start = cache.end
        cache.append(seg)
    return model, cache


def _chunks(cache, timing: TimingConfig, step: int):
    for s in range(0, cache.length, step):
        e = min(cache.length, s + step)
        yield kv_chunk(cache, s, e, timing.modeled_kv_bytes(e - s))[0]


def codec(model, cache, timing: TimingConfig, step: int) -> dict:
    c0 = time.process_time()
    frames = [encode_frame_parts(Frame(1, c)) for c in _chunks(cache, timing, step)]
    c1 = time.process_time()
    # what the socket would deliver (not timed): the stream in pieces of READ_BYTES
    stream = b"".join(b"".join(parts + filler_views(filler)) for parts, filler in frames)
    pieces = [stream[i: i + READ_BYTES] for i in range(0, len(stream), READ_BYTES)]
    del stream
    c2 = time.process_time()
    dec, rld = FrameDecoder(), model.new_cache(cache.length)  # as RLD: room for the prompt
    for piece in pieces:
        for f in dec.feed(piece):
            rld.append(decode_kv(f.message.data))
    c3 = time.process_time()
    assert rld.length == cache.length
    return {"part": "codec", "bytes": sum(map(len, pieces)), "send_cpu_s": c1 - c0,
            "recv_cpu_s": c3 - c2, "cpu_s": c1 - c0 + c3 - c2}


async def _tcp(model, cache, timing: TimingConfig, step: int) -> dict:
    transport = TcpTransport()
    got: asyncio.Future = asyncio.get_running_loop().create_future()

    async def rld(conn) -> None:
        c = model.new_cache(cache.length)
        while c.length < cache.length:
            f = await conn.recv()
            c.append(decode_kv(f.message.data))
        got.set_result(c)

    listener = await transport.serve("127.0.0.1", 0, rld)
    conn = await transport.connect(*listener.address)
    c0 = time.process_time()
    for chunk in _chunks(cache, timing, step):
        await conn.send(Frame(1, chunk))
        await asyncio.sleep(0)
    c = await got
    c1 = time.process_time()
    total = conn.bytes_sent
    conn.close()
    listener.close()
    await listener.wait_closed()
    assert c.length == cache.length
    return {"part": "tcp", "bytes": total, "cpu_s": c1 - c0}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--k", type=float, default=25.0)
    ap.add_argument("--token-scale", type=int, default=32)
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    timing = TimingConfig(kv_scale_k=args.k, token_scale=args.token_scale)
    model, cache = _prompt_cache(args.tokens)
    parts = {"codec": lambda: codec(model, cache, timing, args.chunk_tokens),
             "tcp": lambda: asyncio.run(_tcp(model, cache, timing, args.chunk_tokens))}
    for name, run in parts.items():
        prof = cProfile.Profile() if args.profile else None
        best = None
        for _ in range(args.repeat):
            if prof:
                prof.enable()
            t0 = time.perf_counter()
            out = run()
            out["wall_s"] = time.perf_counter() - t0
            if prof:
                prof.disable()
            if best is None or out["cpu_s"] < best["cpu_s"]:
                best = out
        best["modeled_mb"] = best.pop("bytes") / 1e6
        best["mb_per_cpu_s"] = best["modeled_mb"] / best["cpu_s"]
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                          for k, v in best.items()}), flush=True)
        if prof:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
            print(s.getvalue())


if __name__ == "__main__":
    main()
