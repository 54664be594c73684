"""What WAN loss costs TCP on the emulator: one bulk flow's goodput, and a warm
connection's transfer time by size (run as root).

``sudo python -m testbed.bench.tcp_loss [--topology topologies/two-dc.yaml]
[--scale 25] [--loss none random:5 random:10 ge:5,30,50] [--out FILE]``
builds the topology's emulated network and, for each loss process (set on both
directions of the WAN, as a ``loss`` fault sets it), measures between the two
datacenters' cross-traffic hosts:

- ``bulk``: one iperf3 TCP flow a > b for ``--seconds`` (the first 2 s left
  out): goodput in Mbit/s and the sender's retransmitted segments;
- ``transfers``: a persistent TCP connection (as P's to MD) that asks the far
  side for ``--sizes`` bytes, one transfer at a time, ``--reps`` times each: the
  time from the request to the last byte, median and p90, against the time the
  same transfer takes with no loss (the first row of ``--loss`` should be
  ``none``).

The hosts use the machine's congestion control (``metadata.json`` of a run
names it; here bbr). The virtual clock's loss model (testbed/pdd/wire/
fluid_net.py, docs/virtual-clock.md) takes its bulk figures from this
command's table and is checked against its transfer figures. Loss sizes are
stated in the emulated network's bytes (a scaled run's bytes: a KV of B
nominal bytes is B/k here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from testbed.errors import SpecError
from testbed.impairment import NO_LOSS, LossSpec

PROBE_PORT = 5301
# the far side of the transfer probe: answers each 8-byte size with that many bytes
_SERVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
blob = bytes(1 << 20)
while True:
    head = b""
    while len(head) < 8:
        got = c.recv(8 - len(head))
        if not got:
            sys.exit(0)
        head += got
    n = int.from_bytes(head, "big")
    while n > 0:
        n -= c.send(memoryview(blob)[:min(n, len(blob))])
"""
# the near side: one warm-up transfer, then each size reps times; JSON of seconds
_CLIENT = r"""
import json, socket, sys, time
ip, port, sizes, reps = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
c = socket.create_connection((ip, port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = bytearray(1 << 20)
def one(n):
    t0 = time.monotonic(); c.sendall(n.to_bytes(8, "big")); left = n
    while left > 0:
        got = c.recv_into(buf, min(left, len(buf)))
        if not got:
            raise SystemExit("server closed")
        left -= got
    return time.monotonic() - t0
one(max(sizes))
out = {str(n): [] for n in sizes}
for _ in range(reps):
    for n in sizes:
        out[str(n)].append(one(n)); time.sleep(0.05)
print(json.dumps(out))
"""


def parse_loss(text: str) -> LossSpec:
    """``none``, ``random:PCT`` or ``ge:P,R,BAD[,GOOD]`` (Gilbert-Elliott percentages)."""
    kind, _, arg = text.partition(":")
    try:
        if kind == "none" and not arg:
            return NO_LOSS
        if kind == "random":
            return LossSpec("random", pct=float(arg))
        if kind == "ge":
            vals = [float(v) for v in arg.split(",")]
            if len(vals) in (3, 4):
                return LossSpec("gilbert_elliott", p_pct=vals[0], r_pct=vals[1],
                                bad_loss_pct=vals[2],
                                good_loss_pct=vals[3] if len(vals) == 4 else 0.0)
    except ValueError:
        pass
    raise SpecError("--loss", "loss", "none, random:PCT or ge:P,R,BAD[,GOOD]", text)


def loss_label(loss: LossSpec) -> str:
    if not loss.active:
        return "none"
    if loss.model == "random":
        return f"random:{loss.pct:g}"
    return f"ge:{loss.p_pct:g},{loss.r_pct:g},{loss.bad_loss_pct:g},{loss.good_loss_pct:g}"


def _transfers(net, src: str, dst: str, sizes: list[int], reps: int) -> dict[str, list[float]]:
    from testbed.net.apply import wait_listening
    from testbed.net.registry import stop_process

    server = net.popen(dst, [sys.executable, "-c", _SERVER, str(PROBE_PORT)],
                       what="transfer probe server")
    try:
        wait_listening(net, dst, PROBE_PORT)
        r = net.run(src, [sys.executable, "-c", _CLIENT, net.ip(dst), str(PROBE_PORT),
                          json.dumps(sizes), str(reps)], timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"transfer probe: {r.stderr[-500:]}")
        return json.loads(r.stdout)
    finally:
        stop_process(server.pid, None, timeout_s=1.0)


def measure(net, losses: list[LossSpec], seconds: float, sizes: list[int],
            reps: int) -> list[dict]:
    from testbed.net.calibrate import pick_host, run_iperf
    from testbed.net.runtime import set_link
    from testbed.spec.topology import Role

    a, b = net.plan.topology.datacenters
    src = pick_host(net.plan.topology, a, (Role.CROSS_TRAFFIC, Role.PREFILL))
    dst = pick_host(net.plan.topology, b, (Role.CROSS_TRAFFIC, Role.MAIN_DECODE))
    rows = []
    for loss in losses:
        set_link(net, "wan", loss=loss)
        bulk = run_iperf(net, src, dst, net.ip(dst), ["-t", str(seconds), "-O", "2"], seconds)
        times = _transfers(net, src, dst, sizes, reps)
        rows.append(_row(loss, bulk["bps"], bulk.get("retransmits"), times))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "transfers"}),
              file=sys.stderr, flush=True)
    set_link(net, "wan", loss=NO_LOSS)
    return rows


def virtual_rows(topo, scale: float, losses: list[LossSpec], seconds: float,
                 sizes: list[int], reps: int, seed: int = 1) -> list[dict]:
    """The same measurements on the virtual clock's network model (fluid_net with its loss
    model), between the same hosts: what the model says each figure is."""
    from testbed.pdd.run.vloop import run_virtual
    from testbed.scenario.virtual import network_for
    from testbed.spec.topology import Role
    from testbed.net.calibrate import pick_host

    a, b = topo.datacenters
    src = pick_host(topo, a, (Role.CROSS_TRAFFIC, Role.PREFILL))
    dst = pick_host(topo, b, (Role.CROSS_TRAFFIC, Role.MAIN_DECODE))
    rows = []
    for loss in losses:
        net = network_for(topo, scale, seed)
        for ch in net.channels.values():
            if ch.link == "wan":
                ch.set(0.0, loss=loss)

        async def bulk() -> float:
            pipe = net.pipe(src, dst)
            n = int(net.channels["wan/a>b"].rate_bytes_s * seconds)
            t0 = asyncio.get_running_loop().time()
            pipe.put(bytes(n))
            got = 0
            while got < n:
                got += len(await pipe.get())
            return n * 8 / (asyncio.get_running_loop().time() - t0)

        async def transfers() -> dict[str, list[float]]:
            ask, back = net.pipe(src, dst), net.pipe(dst, src)
            loop = asyncio.get_running_loop()

            async def one(n: int) -> float:
                t0 = loop.time()
                ask.put(n.to_bytes(8, "big"))
                await ask.get()
                back.put(bytes(n))
                got = 0
                while got < n:
                    got += len(await back.get())
                return loop.time() - t0
            await one(max(sizes))
            out = {str(n): [] for n in sizes}
            for _ in range(reps):
                for n in sizes:
                    out[str(n)].append(await one(n))
                    await asyncio.sleep(0.05)
            return out
        bps = run_virtual(bulk())
        net = network_for(topo, scale, seed)
        for ch in net.channels.values():
            if ch.link == "wan":
                ch.set(0.0, loss=loss)
        rows.append(_row(loss, bps, None, run_virtual(transfers())))
    return rows


def _row(loss: LossSpec, bps: float, retransmits, times: dict[str, list[float]]) -> dict:
    return {"loss": loss_label(loss), "mean_loss_pct": round(loss.mean_pct, 3),
            "bulk_mbit": round(bps / 1e6, 2), "retransmits": retransmits,
            "transfers": {n: {"median_s": round(statistics.median(v), 4),
                              "p90_s": round(sorted(v)[int(0.9 * (len(v) - 1))], 4),
                              "all_s": [round(x, 4) for x in v]}
                          for n, v in times.items()}}


def table(doc: dict) -> str:
    rows = doc["rows"]
    sizes = list(rows[0]["transfers"]) if rows else []
    head = ["loss", "mean %", "bulk Mbit/s"] + [f"{int(n) / 1e6:g} MB median / p90 s"
                                                 for n in sizes]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["loss"], f"{r['mean_loss_pct']:g}", f"{r['bulk_mbit']:.0f}"]
        cells += [f"{r['transfers'][n]['median_s']:.3f} / {r['transfers'][n]['p90_s']:.3f}"
                  for n in sizes]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from testbed.net.build import open_network
    from testbed.spec.topology import load_topology

    ap = argparse.ArgumentParser(prog="python -m testbed.bench.tcp_loss", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", default="topologies/two-dc.yaml")
    ap.add_argument("--scale", type=float, default=25.0)
    ap.add_argument("--loss", nargs="+", default=["none", "random:5", "random:10",
                                                  "ge:5,30,50"])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--sizes", default="65536,1048576,4194304",
                    help="transfer sizes in bytes, comma-separated")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", help="write the JSON here too")
    ap.add_argument("--clock", choices=("emulated", "virtual"), default="emulated",
                    help="virtual: the same figures from the virtual clock's network model "
                         "(no root)")
    args = ap.parse_args(argv)
    try:
        losses = [parse_loss(x) for x in args.loss]
    except SpecError as e:
        print(f"tcp_loss: {e}", file=sys.stderr)
        return 2
    sizes = [int(x) for x in args.sizes.split(",")]
    topo = load_topology(args.topology)
    t0 = time.time()
    if args.clock == "virtual":
        rows = virtual_rows(topo, args.scale, losses, args.seconds, sizes, args.reps)
        backend = "virtual"
    else:
        with open_network(topo, None, args.scale) as net:
            rows = measure(net, losses, args.seconds, sizes, args.reps)
            backend = net.plan.backend.value
    doc = {"topology": args.topology, "scale": args.scale, "clock": args.clock,
           "backend": backend,
           "wan_emulated_gbit": topo.wan.a_to_b.rate_gbit / args.scale,
           "wan_rtt_ms": topo.wan.a_to_b.delay_ms + topo.wan.b_to_a.delay_ms,
           "date": time.strftime("%Y-%m-%d", time.gmtime(t0)), "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print(table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
