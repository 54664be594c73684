"""Mooncake Transfer Engine's TCP transport across the emulated WAN, beside plain TCP.

``sudo python -m testbed.bench.mooncake_wan [--rtt-ms 10 40 100] [--loss none random:1]
[--sizes ...] [--reps 10] [--out FILE]`` builds the topology's emulated network
and, for each WAN round-trip time and loss process (set on both directions of
the WAN, as the ``rtt`` and ``loss`` faults set them), moves buffers of each
size from a host in DC A to one in DC B:

- ``mooncake``: ``TransferEngine`` (package ``mooncake-transfer-engine-non-cuda``,
  ``pip install .[mooncake]``) in both hosts, P2P handshake (no metadata
  service), TCP transport; the initiator writes a registered buffer into the
  target's with ``transfer_sync_write``, one transfer at a time, as a prefill
  instance would push one request's KV: the time of the call, median and p90,
  and the goodput it implies; afterwards the target checks every byte of the
  last transfer of each size (a pattern the initiator wrote);
- ``native``: the same sizes over one warm TCP connection (the transfer probe
  of ``testbed.bench.tcp_loss``): request to last byte.

It also counts the TCP connections the target's engine holds after the
transfers (``ss``), which decides the engine's share of a shared line. Needs
root (namespaces) and the package; without the package it exits 2 naming it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from testbed.bench.tcp_loss import NO_LOSS, loss_label, parse_loss

PACKAGE = "mooncake-transfer-engine-non-cuda"
# the target: an engine with one registered buffer; prints its session and buffer, then
# answers "check N SEED" lines (are the first N bytes the pattern of SEED?) until stdin ends
_TARGET = r"""
import json, sys
from mooncake.engine import TransferEngine
ip, size = sys.argv[1], int(sys.argv[2])
te = TransferEngine()
if te.initialize(ip, "P2PHANDSHAKE", "tcp", "") != 0:
    sys.exit("mooncake: initialize failed")
buf = te.allocate_managed_buffer(size)
print(json.dumps({"session": f"{ip}:{te.get_rpc_port()}", "buffer": buf}), flush=True)
for line in sys.stdin:
    _, n, seed = line.split()
    n, seed = int(n), int(seed)
    got = te.read_bytes_from_buffer(buf, n)
    want = (bytes(range(256)) * (n // 256 + 1))[:n]
    want = bytes((b + seed) % 256 for b in want[:4096]) + want[4096:]
    print(json.dumps({"ok": got == want}), flush=True)
"""
# the initiator: writes each size reps times (the first of each not timed: the handshake)
_INITIATOR = r"""
import json, sys, time
from mooncake.engine import TransferEngine
ip, session, peer_buf = sys.argv[1], sys.argv[2], int(sys.argv[3])
sizes, reps = json.loads(sys.argv[4]), int(sys.argv[5])
te = TransferEngine()
if te.initialize(ip, "P2PHANDSHAKE", "tcp", "") != 0:
    sys.exit("mooncake: initialize failed")
buf = te.allocate_managed_buffer(max(sizes))
out = {}
for n in sizes:
    data = (bytes(range(256)) * (n // 256 + 1))[:n]
    data = bytes((b + n % 251) % 256 for b in data[:4096]) + data[4096:]
    te.write_bytes_to_buffer(buf, data, n)
    if te.transfer_sync_write(session, buf, peer_buf, n) != 0:
        sys.exit(f"mooncake: transfer of {n} failed")
    times = []
    for _ in range(reps):
        t0 = time.monotonic()
        rc = te.transfer_sync_write(session, buf, peer_buf, n)
        times.append(time.monotonic() - t0 if rc == 0 else None)
        time.sleep(0.05)
    out[str(n)] = times
# the engine's TCP connections to the target, open now (its namespace has no other socket):
# /proc/net/tcp's established entries (state 01) whose remote address is the target's
peer = "".join(f"{int(x):02X}" for x in reversed(session.split(":")[0].split(".")))
with open("/proc/net/tcp") as f:
    rows = [line.split() for line in f.readlines()[1:]]
out["connections"] = sum(1 for r in rows if r[3] == "01" and r[2].split(":")[0] == peer)
print(json.dumps(out), flush=True)
"""


# one transfer, timed, whatever happens to it: {"rc": engine return code, "s": seconds}
_ONE = r"""
import json, sys, time
from mooncake.engine import TransferEngine
ip, session, peer_buf, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
te = TransferEngine()
if te.initialize(ip, "P2PHANDSHAKE", "tcp", "") != 0:
    sys.exit("mooncake: initialize failed")
buf = te.allocate_managed_buffer(n)
if te.transfer_sync_write(session, buf, peer_buf, 4096) != 0:
    sys.exit("mooncake: the first transfer failed")
print("ready", flush=True)
t0 = time.monotonic()
rc = te.transfer_sync_write(session, buf, peer_buf, n)
print(json.dumps({"rc": rc, "s": round(time.monotonic() - t0, 3)}), flush=True)
"""
HANG_S = 120.0  # a transfer that has not returned by then is reported as a hang


def failure_case(net, src: str, dst: str, n: int, what: str, at_s: float,
                 outage_s: float = 3.0) -> dict:
    """One transfer of ``n`` bytes that meets ``what`` ``at_s`` seconds in: "kill" (the
    target process killed), "flap" (the WAN down for ``outage_s``). What the engine's
    call returned and when, or that it had not returned within ``HANG_S``."""
    import subprocess

    from testbed.net.registry import stop_process
    from testbed.net.runtime import link_down, link_up

    target = net.popen(dst, [sys.executable, "-c", _TARGET, net.ip(dst), str(n)],
                       what="mooncake target", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       text=True)
    init = None
    try:
        hello = json.loads(target.stdout.readline() or "null")
        if not hello:
            raise RuntimeError(f"mooncake target: {target.stderr.read()[-500:]}")
        init = net.popen(src, [sys.executable, "-c", _ONE, net.ip(src), hello["session"],
                               str(hello["buffer"]), str(n)], what="mooncake initiator",
                         stdout=subprocess.PIPE, text=True)
        if init.stdout.readline().strip() != "ready":
            raise RuntimeError(f"mooncake initiator: {init.stderr.read()[-500:]}")
        t0 = time.monotonic()
        time.sleep(at_s)
        if what == "kill":
            stop_process(target.pid, None, timeout_s=1.0)
        else:
            link_down(net, "wan")
            time.sleep(outage_s)
            link_up(net, "wan")
        try:
            init.wait(timeout=HANG_S)
            line = init.stdout.readline()
            out = json.loads(line) if line.strip() else {"rc": None, "s": None,
                                                         "error": init.stderr.read()[-300:]}
        except subprocess.TimeoutExpired:
            out = {"rc": None, "s": None, "hang": f"no return within {HANG_S:g} s"}
        out.update(what=what, at_s=at_s, bytes=n, outage_s=outage_s if what == "flap" else None,
                   since_event_s=None if out.get("s") is None else
                   round(out["s"] - at_s - (outage_s if what == "flap" else 0.0), 3),
                   wall_s=round(time.monotonic() - t0, 3))
        return out
    finally:
        for proc in (init, target):
            if proc is not None and proc.poll() is None:
                stop_process(proc.pid, None, timeout_s=1.0)


def _stats(times: list) -> dict:
    ok = [t for t in times if t is not None]
    if not ok:
        return {"median_s": None, "p90_s": None, "failed": len(times)}
    return {"median_s": round(statistics.median(ok), 4),
            "p90_s": round(sorted(ok)[int(0.9 * (len(ok) - 1))], 4),
            "failed": len(times) - len(ok)}


def mooncake_transfers(net, src: str, dst: str, sizes: list[int], reps: int) -> dict:
    """Mooncake's timed writes from ``src`` into ``dst``, the byte check and the target's
    TCP connections."""
    import subprocess

    from testbed.net.registry import stop_process

    target = net.popen(dst, [sys.executable, "-c", _TARGET, net.ip(dst), str(max(sizes))],
                       what="mooncake target", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       text=True)
    try:
        hello = json.loads(target.stdout.readline() or "null")
        if not hello:
            raise RuntimeError(f"mooncake target: {target.stderr.read()[-500:]}")
        r = net.run(src, [sys.executable, "-c", _INITIATOR, net.ip(src), hello["session"],
                          str(hello["buffer"]), json.dumps(sizes), str(reps)], timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"mooncake initiator: {r.stderr[-800:]}")
        times = json.loads(r.stdout.strip().splitlines()[-1])
        connections = times.pop("connections")
        target.stdin.write(f"check {sizes[-1]} {sizes[-1] % 251}\n")
        target.stdin.flush()
        intact = json.loads(target.stdout.readline())["ok"]
        return {"transfers": {n: _stats(v) for n, v in times.items()},
                "intact": intact, "tcp_connections": connections}
    finally:
        stop_process(target.pid, None, timeout_s=2.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.bench.mooncake_wan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", default="topologies/two-dc.yaml")
    ap.add_argument("--scale", type=float, default=25.0)
    ap.add_argument("--rtt-ms", type=float, nargs="+", default=[10.0, 40.0, 100.0])
    ap.add_argument("--loss", nargs="+", default=["none"])
    ap.add_argument("--sizes", default="65536,1048576,4194304,16777216")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--failures", action="store_true",
                    help="also a 64 MiB transfer whose target is killed 0.5 s in, and one "
                         "whose WAN goes down 0.5 s in for each --outage-s (at the first "
                         "--rtt-ms)")
    ap.add_argument("--outage-s", type=float, nargs="+", default=[3.0])
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    try:
        import mooncake.engine  # noqa: F401
    except ImportError:
        print(f"mooncake_wan: needs the package {PACKAGE} (pip install .[mooncake])",
              file=sys.stderr)
        return 2
    from testbed.bench.tcp_loss import _transfers
    from testbed.net.build import open_network
    from testbed.net.calibrate import pick_host
    from testbed.net.runtime import set_link
    from testbed.spec.topology import Role, load_topology

    topo = load_topology(args.topology)
    sizes = [int(x) for x in args.sizes.split(",")]
    losses = [parse_loss(x) for x in args.loss]
    a, b = topo.datacenters
    src = pick_host(topo, a, (Role.PREFILL,))
    dst = pick_host(topo, b, (Role.MAIN_DECODE,))
    rows, t0 = [], time.time()
    with open_network(topo, None, args.scale) as net:
        for rtt in args.rtt_ms:
            set_link(net, "wan", delay_ms=rtt / 2)
            for loss in losses:
                set_link(net, "wan", loss=loss)
                mc = mooncake_transfers(net, src, dst, sizes, args.reps)
                native = _transfers(net, dst, src, sizes, args.reps)  # src fetches: dst sends
                row = {"rtt_ms": rtt, "loss": loss_label(loss), "mooncake": mc,
                       "native": {n: _stats(v) for n, v in native.items()}}
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("rtt_ms", "loss")}
                                 | {"intact": mc["intact"],
                                    "tcp_connections": mc["tcp_connections"]}),
                      file=sys.stderr, flush=True)
            set_link(net, "wan", loss=NO_LOSS)
        failures = []
        if args.failures:
            set_link(net, "wan", delay_ms=args.rtt_ms[0] / 2)
            cases = [("kill", 0.0)] + [("flap", o) for o in args.outage_s]
            for what, outage in cases:
                failures.append(failure_case(net, src, dst, 64 * 2**20, what, 0.5, outage))
                print(json.dumps(failures[-1]), file=sys.stderr, flush=True)
        backend = net.plan.backend.value
    doc = {"topology": args.topology, "scale": args.scale, "backend": backend,
           "wan_emulated_gbit": topo.wan.a_to_b.rate_gbit / args.scale, "src": src, "dst": dst,
           "date": time.strftime("%Y-%m-%d", time.gmtime(t0)), "rows": rows,
           "failures": failures}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print(table(doc))
    return 0


def table(doc: dict) -> str:
    rate = doc["wan_emulated_gbit"] * 1e9 / 8
    out = ["| RTT ms | loss | size | native median / p90 s | mooncake median / p90 s | "
           "mooncake goodput Gbit/s (median) | line share |", "|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        for n, mc in r["mooncake"]["transfers"].items():
            nat = r["native"][n]
            med = mc["median_s"]
            gbit = f"{int(n) * 8 / med / 1e9:.3f}" if med else "-"
            share = f"{int(n) / med / rate:.2f}" if med else "-"
            out.append(f"| {r['rtt_ms']:g} | {r['loss']} | {int(n) / 2**20:g} MiB | "
                       f"{nat['median_s']} / {nat['p90_s']} | {med} / {mc['p90_s']} | "
                       f"{gbit} | {share} |")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
