"""The 100-token handoff microbenchmark's two endpoints (one process each).

Owns the measured exchange, run as ``python -m testbed.bench.handoff_bench
server|client ...`` inside the MD and RLD hosts (testbed.bench.handoff starts
them over the emulated WAN). Two ways to give MD 100 tokens that RLD
generated:

- ``kv``:  RLD ships the tokens' incremental KV (``tokens x kv_bytes_per_token
  / k`` bytes in KV_CHUNK frames); MD has them when the last byte arrives.
- ``ids``: RLD ships the 100 token IDs (one HANDOFF frame); MD recomputes
  their KV with one ``extend`` pass of the tiny model on a prompt of
  ``context`` tokens, padded to the cost model's ``extend_s`` on GPU_B.

The handoff time of a trial is MD-ready minus RLD-send-start, both taken
with CLOCK_MONOTONIC, which every namespace on the machine shares. The
server appends one JSON line per trial to its output file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from testbed.pdd.compute.costmodel import GPU_B, CostModel
from testbed.pdd.compute.model import ModelConfig, build_model, set_threads
from testbed.pdd.compute.pacing import AsyncPacer
from testbed.pdd.wire.protocol import Frame, Handoff, HandoffAck, KvChunk, KvDone
from testbed.pdd.wire.transport import TcpTransport

CHUNK_BYTES = 1 << 20
MODEL = ModelConfig(n_layer=2, n_head=2, d_model=64)


async def server(args) -> None:
    model = build_model(MODEL)
    prompt = [(7 * i + 3) % MODEL.vocab_size for i in range(args.context)]
    _, cache = model.prefill(prompt)  # MD already holds the prompt's KV
    cost = CostModel(GPU_B, token_scale=args.token_scale)
    pacer = AsyncPacer(1.0)
    out = open(args.out, "a")

    async def handle(conn) -> None:
        got = 0
        while True:
            frame = await conn.recv()
            msg, meta = frame.message, frame.request_id
            if isinstance(msg, KvChunk):
                got += len(msg.data)
            elif isinstance(msg, (KvDone, Handoff)):
                t_sent = meta / 1e6  # the client puts its send time (us) in the request id
                if isinstance(msg, Handoff):
                    t0 = time.monotonic()
                    model.extend(cache, list(msg.token_ids))
                    cache.truncate(len(prompt))  # back to the prompt for the next trial
                    await pacer.pad(cost.extend_s(len(msg.token_ids), args.context),
                                    time.monotonic() - t0)
                ready = time.monotonic()
                out.write(json.dumps({"method": "ids" if isinstance(msg, Handoff) else "kv",
                                      "handoff_ms": (ready - t_sent) * 1e3,
                                      "bytes": got}) + "\n")
                out.flush()
                got = 0
                await conn.send(Frame(frame.request_id, HandoffAck(0, 0)))

    listener = await TcpTransport().serve("0.0.0.0", args.port, handle)
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        listener.close()


async def client(args) -> None:
    conn = await TcpTransport().connect(args.host, args.port)
    kv_bytes = int(args.tokens * args.kv_bytes_per_token / args.scale)
    ids = tuple(range(100, 100 + args.tokens))
    for trial in range(args.trials):
        for method in ("kv", "ids"):
            rid = int(time.monotonic() * 1e6)
            if method == "kv":
                left, start = kv_bytes, 0
                while left > 0:
                    n = min(CHUNK_BYTES, left)
                    await conn.send(Frame(rid, KvChunk(0, 1, start, start + 1, bytes(n))))
                    left -= n
                await conn.send(Frame(rid, KvDone(args.tokens, kv_bytes, 1)))
            else:
                await conn.send(Frame(rid, Handoff(0, 1, ids, True)))
            await conn.recv()  # MD's ack: the next trial starts on an idle path
            await asyncio.sleep(args.gap_s)
    conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("side", choices=("server", "client"))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7300)
    ap.add_argument("--out", help="server: JSONL of trials")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--context", type=int, default=2048, help="real tokens already at MD")
    ap.add_argument("--token-scale", type=int, default=32)
    ap.add_argument("--kv-bytes-per-token", type=int, default=46_490, help="paper: 4649 KB/100")
    ap.add_argument("--scale", type=float, default=1.0, help="bandwidth scale k")
    ap.add_argument("--gap-s", type=float, default=0.1)
    args = ap.parse_args(argv)
    set_threads(1)
    asyncio.run(server(args) if args.side == "server" else client(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
