"""Calibration: what each link achieves against what it was configured for.

Owns ``calibrate``: with the network up, it measures every link (or the
ones asked for) with independent tools run inside the namespaces - ping for
RTT, iperf3 TCP for rate, iperf3 UDP for one-way loss - and compares with
the plan: emulated rate = nominal/k (TCP goodput is expected at
GOODPUT_SHARE of it: Ethernet+IP+TCP-with-timestamps headers at 1500 MTU),
RTT = sum of one-way delays, loss = configured mean. Each figure gets an
error and a pass/fail against the link's stated tolerance. On a lossy link
the rate is measured with the loss switched off for that moment (TCP
cannot fill a lossy long-RTT path; both changes go to the events log) and
the loss with UDP afterwards (less what the receiver's own socket dropped,
counted by its namespace's Udp InErrors: that is the host, not the link).
With ``shaper_rate`` it also measures the shaper alone, free of TCP: UDP
offered at 1.2x the rate, the receiver's steady per-second rate (the
figure is left unmeasured, with a note, when iperf3 cannot offer that
much: above ~1 Gbit/s here, or in a qemu guest).

Parsing of tool output is pure (``parse_ping``, ``parse_iperf``) and unit
tested; measuring needs a built EmulatedNetwork.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from testbed.errors import EmulationError
from testbed.net.apply import wait_listening
from testbed.net.runtime import set_link
from testbed.net.shaping import Backend
from testbed.impairment import NO_LOSS
from testbed.spec.topology import Role, gateway_name

GOODPUT_SHARE = 1448 / 1514  # TCP payload per wire byte (MSS 1448, 66 header bytes)
RATE_TOL = {"wan": 0.05, "intra": 0.10}  # htb: 1-7% at 10 Gbit/s, tighter below 5
RTT_TOL_MS = 2.0
LOSS_TOL_PTS = 0.3
IPERF_PORT = 5201
UDP_PAYLOAD = 1448           # bytes per datagram: 1490 on the wire (UDP 8, IP 20, Ethernet 14)
UDP_SHARE = UDP_PAYLOAD / (UDP_PAYLOAD + 42)
UDP_OVERLOAD = 1.2           # offered load / htb rate for the shaper figure


@dataclass
class Check:
    name: str
    configured: float
    measured: float | None
    unit: str
    tolerance: float        # absolute, in unit
    passed: bool | None = None
    note: str = ""          # why a figure is missing, or the attempts behind it

    def judge(self) -> "Check":
        self.passed = None if self.measured is None else \
            abs(self.measured - self.configured) <= self.tolerance
        return self

    @property
    def error(self) -> float | None:
        return None if self.measured is None else self.measured - self.configured


@dataclass
class LinkResult:
    link: str
    src: str
    dst: str
    nominal_rate_gbit: float
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks)


_PING_RE = re.compile(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms")
_PING_LOSS_RE = re.compile(r"(\d+) packets transmitted, (\d+) received")


def parse_ping(text: str) -> dict:
    """min/avg/max/mdev RTT (ms) and counts from ping's summary."""
    m, c = _PING_RE.search(text), _PING_LOSS_RE.search(text)
    if not m or not c:
        raise EmulationError(f"cannot parse ping output: {text[-300:]!r}")
    lo, avg, hi, mdev = map(float, m.groups())
    return {"min_ms": lo, "avg_ms": avg, "max_ms": hi, "mdev_ms": mdev,
            "sent": int(c.group(1)), "received": int(c.group(2))}


def parse_iperf(text: str) -> dict:
    """Rate (bit/s), and for UDP the loss, from iperf3 -J output."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        raise EmulationError(f"iperf3 gave no JSON: {text[-300:]!r}") from None
    if "error" in doc:
        raise EmulationError(f"iperf3: {doc['error']}")
    end = doc["end"]
    if doc["start"]["test_start"]["protocol"] == "TCP":
        return {"bps": end["sum_received"]["bits_per_second"],
                "retransmits": end.get("sum_sent", {}).get("retransmits")}
    s = end.get("sum_received") or end["sum"]  # receiver's view when iperf3 has it
    sent = end.get("sum_sent") or end["sum"]
    # per-second figures; with -R they are the receiver's (the client receives)
    intervals = [i["sum"]["bits_per_second"] for i in doc.get("intervals", [])
                 if not i["sum"].get("omitted")]
    return {"bps": s["bits_per_second"], "lost_pct": s["lost_percent"],
            "packets": s["packets"], "lost": s["lost_packets"],
            "sent_bps": sent["bits_per_second"], "interval_bps": intervals}


def _ping(net, src: str, dst_ip: str, count: int, interval: float) -> dict:
    net.run(src, ["ping", "-c", "2", "-i", "0.2", "-W", "2", dst_ip], timeout=15)  # ARP warm-up
    r = net.run(src, ["ping", "-q", "-c", str(count), "-i", str(interval), "-W", "3", dst_ip],
                timeout=count * interval + 30)
    return parse_ping(r.stdout)


def run_iperf(net, src: str, dst: str, dst_ip: str, args: list[str], seconds: float,
              attempts: int = 3) -> dict:
    """One iperf3 test from ``src`` to a one-shot server in ``dst`` (-J output parsed)."""
    for attempt in range(attempts):
        try:
            return _iperf_once(net, src, dst, dst_ip, args, seconds)
        except EmulationError as e:
            # iperf3 3.12 starts a UDP test with one setup datagram and no
            # retry: on a lossy link that datagram is lost now and then.
            if "-u" not in args or "unable to read from stream socket" not in str(e) \
                    or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _iperf_once(net, src: str, dst: str, dst_ip: str, args: list[str], seconds: float) -> dict:
    from testbed.net.registry import stop_process

    server = net.popen(dst, ["iperf3", "-s", "-1", "-p", str(IPERF_PORT)], what="iperf3 server")
    try:
        wait_listening(net, dst, IPERF_PORT)
        r = net.run(src, ["iperf3", "-c", dst_ip, "-p", str(IPERF_PORT), "-J"] + args,
                    timeout=seconds + 30)
        return parse_iperf(r.stdout)
    finally:
        stop_process(server.pid, None, timeout_s=1.0)


def _measure(net, link: str, src: str, dst: str, dst_ip: str, fwd: str, rev: str,
             opts: "CalibrateOptions") -> LinkResult:
    ab, ba = net.channels[fwd], net.channels[rev]
    kind = "wan" if link == "wan" else "intra"
    res = LinkResult(link, src, dst, ab.spec.rate_gbit)
    ping = _ping(net, src, dst_ip, opts.ping_count, opts.ping_interval_s)
    rtt_cfg = ab.spec.delay_ms + ba.spec.delay_ms
    if net.plan.backend is Backend.USERSPACE and kind == "intra":
        rtt_cfg = 0.0  # µs delays are below the userspace backend's resolution
    res.checks.append(Check("rtt_ms", rtt_cfg, ping["avg_ms"], "ms", RTT_TOL_MS).judge())
    secs = opts.seconds if kind == "wan" else opts.seconds_intra
    lossy = [c for c in (ab, ba) if c.spec.loss.active]
    for c in lossy:  # TCP cannot fill a lossy long-RTT path: measure the rate without loss
        set_link(net, c.id, loss=NO_LOSS)
    try:
        for name, ch, extra in (("rate_fwd_mbit", ab, []), ("rate_rev_mbit", ba, ["-R"])):
            want = ch.htb.rate_bps * GOODPUT_SHARE / 1e6
            tol = want * (opts.rate_tol if opts.rate_tol is not None else RATE_TOL[kind])
            args = ["-t", str(secs), "-O", str(opts.omit_s)] + extra
            got = attempts_until(lambda: run_iperf(net, src, dst, dst_ip, args, secs)["bps"] / 1e6,
                                 want - tol, opts.rate_attempts)
            check = Check(name, want, max(got), "Mbit/s", tol)
            if len(got) > 1:
                check.note = "attempts " + ", ".join(f"{g:.1f}" for g in got) + " Mbit/s"
            res.checks.append(check.judge())
        if opts.shaper_rate:
            res.checks += [_shaper_rate(net, snd, ip, rcv, n, ch, secs, kind)
                           for n, ch, snd, ip, rcv in (("shaper_fwd_mbit", ab, src, net.ip(src), dst),
                                                       ("shaper_rev_mbit", ba, dst, dst_ip, src))]
    finally:
        for c in lossy:
            set_link(net, c.id, loss=c.spec.loss)
    if kind == "wan" and opts.loss:
        for name, ch, extra, receiver in (("loss_fwd_pct", ab, [], dst),
                                          ("loss_rev_pct", ba, ["-R"], src)):
            bw = min(50e6, ch.htb.rate_bps * 0.2)
            before = udp_in_errors(net, receiver)
            r = run_iperf(net, src, dst, dst_ip, ["-u", "-b", str(int(bw)), "-l", "1200", "-t",
                                                  str(opts.loss_seconds)] + extra,
                          opts.loss_seconds)
            res.checks.append(loss_check(name, ch.spec.loss.mean_pct, r,
                                         udp_in_errors(net, receiver) - before))
    return res


def loss_check(name: str, configured_pct: float, iperf: dict, receiver_drops: int) -> Check:
    """The link's loss from one UDP test: what iperf3 counted lost, less what the
    receiving host's own socket dropped (``receiver_drops``: its Udp InErrors over
    the test; a CPU-starved receiver, e.g. in a software-emulated guest, drops
    datagrams the link delivered). Those are named in the note, not judged."""
    packets, lost = int(iperf["packets"]), int(iperf["lost"])
    link_lost = max(0, lost - max(0, receiver_drops))
    check = Check(name, configured_pct, 100.0 * link_lost / packets if packets else None, "%",
                  LOSS_TOL_PTS)
    if receiver_drops > 0:
        check.note = (f"iperf3 lost {lost} of {packets}; {receiver_drops} of them dropped by "
                      f"the receiver's socket (Udp InErrors), not by the link")
    elif not packets:
        check.note = "iperf3 received no datagram"
    return check.judge()


def parse_udp_in_errors(snmp: str) -> int:
    """``InErrors`` of the ``Udp:`` lines of /proc/net/snmp (a header line, then values)."""
    rows = [line.split()[1:] for line in snmp.splitlines() if line.startswith("Udp:")]
    if len(rows) < 2 or "InErrors" not in rows[0]:
        raise EmulationError(f"no Udp InErrors in /proc/net/snmp: {snmp[-300:]!r}")
    return int(rows[1][rows[0].index("InErrors")])


def udp_in_errors(net, host: str) -> int:
    """The UDP datagrams ``host``'s namespace dropped on receipt so far (its own counters)."""
    return parse_udp_in_errors(net.run(host, ["cat", "/proc/net/snmp"]).stdout)


def attempts_until(measure, floor: float, attempts: int) -> list[float]:
    """Call ``measure`` until a figure reaches ``floor`` or ``attempts`` ran;
    every figure, in order (the caller keeps the best)."""
    got: list[float] = []
    while len(got) < attempts and (not got or max(got) < floor):
        got.append(measure())
    return got


def _shaper_rate(net, sender: str, sender_ip: str, receiver: str, name: str, ch, secs: float,
                 kind: str) -> Check:
    """The shaper's own rate, free of TCP: UDP offered at UDP_OVERLOAD x the
    htb rate, against rate x UDP_SHARE. The figure is the receiver's mean
    per-second rate without the first and last second (iperf3 -R: the client
    receives; totals would count what sat in the queue at the end as lost)."""
    offered = ch.htb.rate_bps * UDP_OVERLOAD
    r = run_iperf(net, receiver, sender, sender_ip,
                  ["-u", "-b", str(int(offered)), "-l", str(UDP_PAYLOAD), "-t", str(secs), "-R"],
                  secs)
    want = ch.htb.rate_bps * UDP_SHARE / 1e6
    steady = r["interval_bps"][1:-1]
    check = Check(name, want, sum(steady) / len(steady) / 1e6 if steady else None, "Mbit/s",
                  want * RATE_TOL[kind])
    if not steady:
        check.note = f"no steady second in a {secs:g} s test"
    elif r["sent_bps"] < ch.htb.rate_bps * UDP_SHARE * (1 + RATE_TOL[kind]):
        check.measured = None  # the sender, not the shaper, set the pace
        check.note = (f"iperf3 sent only {r['sent_bps'] / 1e6:.1f} Mbit/s: cannot overload "
                      f"{ch.htb.rate_bps / 1e6:g} Mbit/s")
    return check.judge()


@dataclass(frozen=True)
class CalibrateOptions:
    links: tuple[str, ...] | None = None  # None: every link
    seconds: float = 6.0        # WAN iperf3 TCP duration
    omit_s: float = 2.0         # slow start left out of the WAN figure
    seconds_intra: float = 2.0
    ping_count: int = 100
    ping_interval_s: float = 0.01
    loss: bool = True
    loss_seconds: float = 2.0
    shaper_rate: bool = False   # also the UDP shaper figure (shaper_*_mbit)
    # A TCP rate below tolerance is measured again, up to rate_attempts runs,
    # and the best kept: a shaper cannot deliver more than its rate, but TCP
    # in a CPU-starved sender (a software-emulated guest) delivers less.
    rate_attempts: int = 1
    rate_tol: float | None = None  # relative; None: RATE_TOL of the link's kind


def pick_host(topo, dc, roles: tuple[Role, ...]) -> str:
    for role in roles:
        for h in dc.hosts:
            if role in h.roles:
                return h.name
    return dc.hosts[0].name


def calibrate(net, opts: CalibrateOptions = CalibrateOptions()) -> list[LinkResult]:
    """Measure the WAN (between cross-traffic hosts) and every host link."""
    topo = net.plan.topology
    a, b = topo.datacenters
    results = []
    want = set(opts.links) if opts.links else None
    if want is None or "wan" in want:
        src = pick_host(topo, a, (Role.CROSS_TRAFFIC, Role.PREFILL))
        dst = pick_host(topo, b, (Role.CROSS_TRAFFIC, Role.MAIN_DECODE))
        results.append(_measure(net, "wan", src, dst, net.ip(dst), "wan/a>b", "wan/b>a", opts))
    for dc in topo.datacenters:
        gw = gateway_name(dc.name)
        for h in dc.hosts:
            link = f"host:{h.name}"
            if want is None or link in want:
                results.append(_measure(net, link, h.name, gw, dc.gateway_ip,
                                        f"{link}/up", f"{link}/down", opts))
    return results


def results_json(net, results: list[LinkResult]) -> dict:
    return {"topology": net.plan.topology.name, "backend": net.plan.backend.value,
            "scale": net.plan.scale, "passed": all(r.passed for r in results),
            "links": [dict(asdict(r), passed=r.passed) for r in results]}


def results_table(net, results: list[LinkResult]) -> str:
    lines = [f"topology {net.plan.topology.name}  backend {net.plan.backend.value}  "
             f"scale k={net.plan.scale:g} (emulated rate = nominal/k)",
             f"{'link':<14} {'check':<15} {'configured':>11} {'measured':>10} {'error':>9} "
             f"{'tol':>8}  ok"]
    for r in results:
        for c in r.checks:
            m = "-" if c.measured is None else f"{c.measured:.3f}"
            e = "-" if c.error is None else f"{c.error:+.3f}"
            ok = {True: "ok", False: "FAIL", None: "?"}[c.passed]
            extra = f"; nominal {r.nominal_rate_gbit:g} Gbit/s" if c.unit == "Mbit/s" else ""
            lines.append(f"{r.link:<14} {c.name:<15} {c.configured:>11.3f} {m:>10} {e:>9} "
                         f"{c.tolerance:>8.3f}  {ok}   [{c.unit}{extra}]"
                         + (f"  {c.note}" if c.note else ""))
    return "\n".join(lines)
