"""The fidelity verdict: did the host emulate what the scenario configured?

Owns ``mode_fidelity`` (one mode's figures, verdict and reasons, from its
run directory files), ``run_fidelity`` (the run's: the worst mode's
verdict, every reason) and ``TOLERANCES``. A figure measures PDD only
when the host kept up with the network, the chips' modeled times and the
roles' message handling it emulated; this module says whether it did,
over the workload window (``workload_start`` to ``workload_end``):

- network: the userspace delay line's lateness (each frame's send time
  minus its scheduled release; ``delaylines.jsonl``), the live RTT over its
  configured value after removing the queueing the shapers' backlogs
  explain (``ping.txt`` against ``links.csv``; the only timing figure with
  the netem backend), the shapers' delivered rate while their queue stayed
  backlogged (``links.csv``), and drops no configured loss explains (the
  delay lines' kernel and transmit drops, and stats they did not answer);
- compute: per role process, the share of paced steps whose real compute
  overran the modeled time and the overrun time as a share of the modeled
  time, and the event loop's lag p99 (``roles/NAME.stats.jsonl``);
- host: CPU busy share per core and peak memory in use (``host.jsonl``); shown
  beside them, not judged: the CPU time a hypervisor took (steal).

Each figure has a tolerance in ``TOLERANCES``; docs/design.md ("The
fidelity verdict") argues each one by the error it lets into TTFT. A
figure without data (an older run directory, the netem backend's delay
line) is null and judges nothing. Pure: reads files, writes nothing.

Example::

    fid = run_fidelity(load_run("runs/quickstart"))
    fid["verdict"], fid["reasons"]        # "faithful", []
    fid["modes"]["pdd"]["compute"]["roles"]["md1"]["overrun_time_share"]
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from testbed.histogram import difference, merge, quantile_ms

FAITHFUL, DEGRADED = "faithful", "degraded"


@dataclass(frozen=True)
class Tolerances:
    """The limits a faithful run stays within (docs/design.md argues each)."""

    delay_lateness_p99_ms: float = 1.0  # a frame leaves its delay line at most this late
    rtt_excess_p50_ms: float = 2.0  # + the configured jitter of both directions
    shaper_min_ratio: float = 0.95  # delivered / configured rate while backlogged
    shaper_min_backlogged_s: float = 2.0  # judged only with this much backlogged time
    unexplained_drop_share: float = 1e-4  # of the frames the delay lines took in
    overrun_time_share: float = 0.05  # a role's overrun time / its modeled time
    loop_lag_p99_ms: float = 5.0  # a role's event loop
    cpu_busy_share: float = 0.95  # the busiest core over the window
    memory_share: float = 0.90  # peak memory in use / the machine's


TOLERANCES = Tolerances()
STEAL_NOTE_SHARE = 0.01  # steal_line: below it the run's own load is the likelier cause


def _read_jsonl(path: Path) -> list[dict]:
    """The complete lines of a JSONL file (a truncated last line is a killed writer)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _around(rows: Sequence[dict], window: tuple[float, float] | None) -> tuple[dict, dict] | None:
    """The last snapshot at or before the window's start (or the first one) and the first
    at or after its end (or the last one) of cumulative snapshots sorted by t_mono."""
    if not rows:
        return None
    if window is None:
        return rows[0], rows[-1]
    start, end = window
    before = [r for r in rows if r["t_mono"] <= start]
    after = [r for r in rows if r["t_mono"] >= end]
    return (before[-1] if before else rows[0]), (after[0] if after else rows[-1])


# -- network -------------------------------------------------------------
def down_windows(events: Sequence[Mapping]) -> dict[str, list[tuple[float, float]]]:
    """{link: [(down, up)]} from the run's ``link_down``/``link_up`` events (a link
    flap: the fault takes both ends down); a link still down at the end: up = inf."""
    out: dict[str, list[tuple[float, float]]] = {}
    down: dict[str, float] = {}
    for e in sorted((e for e in events if e.get("kind") in ("link_down", "link_up")),
                    key=lambda e: float(e["t_mono"])):
        link, t = str(e.get("link")), float(e["t_mono"])
        if e["kind"] == "link_down":
            down.setdefault(link, t)
        elif link in down:
            out.setdefault(link, []).append((down.pop(link), t))
    for link, t in down.items():
        out.setdefault(link, []).append((t, float("inf")))
    return out


def _flap_drops(rs: Sequence[dict], a: dict, b: dict,
                windows: Sequence[tuple[float, float]]) -> int:
    """The transmit and kernel drops between snapshots a and b that fell in sample
    intervals overlapping a window when the link was down: a frame the delay line
    held when its out interface went down is lost, as on a real link that fails."""
    if not windows:
        return 0
    keys = ("dropped_kernel", "dropped_tx")
    inside = [r for r in rs if a["t_mono"] <= r["t_mono"] <= b["t_mono"]]
    n = 0
    for x, y in zip(inside, inside[1:]):
        if any(x["t_mono"] <= up and y["t_mono"] >= down for down, up in windows):
            n += sum(y[k] - x[k] for k in keys)
    return n


def delay_line_figures(rows: Sequence[dict], window,
                       events: Sequence[Mapping] = ()) -> dict | None:
    """Per delay line (channel): lateness p50/p99/max over the window, frames and the
    drops nothing configured explains (drops while the channel's link was down, from
    ``events``, are the fault's); None without delay lines."""
    downs = down_windows(events)
    by_channel: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: r["t_mono"]):
        by_channel.setdefault(r["channel"], []).append(r)
    if not by_channel:
        return None
    out = {}
    for cid, rs in by_channel.items():
        answered = [r for r in rs if not r.get("unanswered")]
        unanswered = len(rs) - len(answered)
        ends = _around(answered, window)
        if ends is None:
            out[cid] = {"unanswered": unanswered}
            continue
        a, b = ends
        late = difference(b["lateness"], a["lateness"] if a is not b else None)
        unexplained = sum(b[k] - (a[k] if a is not b else 0)
                          for k in ("dropped_kernel", "dropped_tx"))
        unexplained -= _flap_drops(answered, a, b, downs.get(cid.split("/")[0], ()))
        frames = b["frames_in"] - (a["frames_in"] if a is not b else 0)
        # timed when read: late by at most the loop's sub-ms sleep, inside the lateness
        # tolerance, so a figure and not a reason
        unstamped = b.get("unstamped", 0) - (a.get("unstamped", 0) if a is not b else 0)
        out[cid] = {"frames": frames, "unstamped": unstamped,
                    "lateness_p50_ms": quantile_ms(late, 0.5),
                    "lateness_p99_ms": quantile_ms(late, 0.99),
                    "lateness_max_ms": late["max_ms"] if late["n"] else None,
                    "unexplained_drops": unexplained, "unanswered": unanswered}
    return out


_PING = re.compile(r"^\[(\d+\.\d+)\].*time=([\d.]+) ms")


def parse_ping(text: str) -> list[tuple[float, float]]:
    """(wall time, RTT ms) of each reply of ``ping -D`` output."""
    out = []
    for line in text.splitlines():
        m = _PING.match(line)
        if m:
            out.append((float(m.group(1)), float(m.group(2))))
    return out


def _wall_to_mono(events: Sequence[Mapping]) -> float | None:
    """Offset t_mono - t_wall of the run's clock (from its events)."""
    for e in events:
        if "t_mono" in e and "t_wall" in e:
            return float(e["t_mono"]) - float(e["t_wall"])
    return None


def configured_delays(topology: Mapping, events: Sequence[Mapping]) -> list[tuple[float, float, float]]:
    """(from t_mono, configured RTT ms, configured jitter ms of both directions), as the
    WAN's set_link events change them."""
    wan = topology.get("wan") or {}
    cur = {"wan/a>b": dict(wan.get("a_to_b") or {}), "wan/b>a": dict(wan.get("b_to_a") or {})}

    def now(t):
        d = sum(float(c.get("delay_ms") or 0) for c in cur.values())
        j = sum(float(c.get("jitter_ms") or 0) for c in cur.values())
        return (t, d, j)

    out = [now(float("-inf"))]
    for e in events:
        if e.get("kind") == "set_link" and e.get("channel") in cur:
            for k in ("delay_ms", "jitter_ms"):
                if k in e:
                    cur[e["channel"]][k] = e[k]
            out.append(now(float(e["t_mono"])))
    return out


def _at(series: Sequence[tuple], t: float) -> tuple:
    val = series[0]
    for s in series:
        if s[0] <= t:
            val = s
        else:
            break
    return val


def queueing_ms(links: Sequence, t: float, on_path: set[tuple[str, str]]) -> float:
    """The queueing delay the backlogs of the path's channels explain at time t (the
    sample nearest in time of each channel: backlog bits / its emulated rate)."""
    total = 0.0
    best: dict[tuple[str, str], object] = {}
    for s in links:
        key = (s.link, s.direction)
        if key not in on_path or s.backlog_bytes is None or not s.emulated_rate_gbit:
            continue
        if key not in best or abs(s.t_mono - t) < abs(best[key].t_mono - t):
            best[key] = s
    for s in best.values():
        total += s.backlog_bytes * 8 / (s.emulated_rate_gbit * 1e9) * 1000.0
    return total


def idle_excess_ms(events: Sequence[Mapping]) -> float:
    """What the path added to the configured RTT before the workload, with no queue: the
    preflight ping's average minus the configured RTT (0 without a preflight event)."""
    for e in events:
        if e.get("kind") == "preflight" and e.get("rtt_measured_ms") is not None:
            return float(e["rtt_measured_ms"]) - float(e.get("rtt_configured_ms") or 0.0)
    return 0.0


def rtt_figures(ping_text: str | None, events, links, topology: Mapping, window,
                path_hosts: tuple[str, str] | None) -> dict | None:
    """The live RTT's excess over the configured RTT, with the queueing the shapers'
    backlogs explain and the path's idle excess (``idle_excess_ms``: what it added
    before the workload, which the preflight judges with its own tolerance) removed:
    what the host added under load. None without probes. A software-emulated guest
    adds 3-3.7 ms to every round trip at idle (its preflight: 42.96-43.69 ms for
    40), and that offset is the VM's CPU, not lateness under load; on this host
    the idle excess is 0.23-0.64 ms."""
    if not ping_text:
        return None
    offset = _wall_to_mono(events)
    replies = parse_ping(ping_text)
    if offset is None or not replies:
        return {"probes": 0, "excess_p50_ms": None, "excess_p99_ms": None}
    on_path = {(link, d) for link in ("wan",) for d in ("a>b", "b>a")}
    on_path |= {(f"gw:{dc}", d) for dc in ("a", "b") for d in ("up", "down")}
    for h in path_hosts or ():
        on_path |= {(f"host:{h}", "up"), (f"host:{h}", "down")}
    delays = configured_delays(topology, events)
    idle = idle_excess_ms(events)
    excess, jitter = [], 0.0
    for wall, rtt in replies:
        t = wall + offset
        if window is not None and not window[0] <= t <= window[1]:
            continue
        _, rtt_cfg, jit = _at(delays, t)
        jitter = max(jitter, jit)
        excess.append(rtt - rtt_cfg - queueing_ms(links, t, on_path) - idle)
    excess.sort()
    if not excess:
        return {"probes": 0, "excess_p50_ms": None, "excess_p99_ms": None}
    q = lambda p: round(excess[min(len(excess) - 1, int(p * len(excess)))], 3)  # noqa: E731
    return {"probes": len(excess), "excess_p50_ms": q(0.5), "excess_p99_ms": q(0.99),
            "configured_jitter_ms": jitter, "idle_excess_ms": round(idle, 3)}


# A shaper's queue is backlogged at a read when it holds more than two full frames: one
# or two are a packet between the rate limiter's dequeues, not a queue.
QUEUED_MIN_BYTES = 2 * 1514


def shaper_figures(links: Sequence, window) -> dict:
    """Per channel: its delivered rate over the intervals whose both ends found its queue
    backlogged (more than QUEUED_MIN_BYTES), against the emulated rate configured then (a queue that emptied inside
    an interval makes the ratio low, never high). Both ends backlogged does not make an
    interval backlogged throughout: a 136 KB queue drains in 1 ms at 1 Gbit/s, and a burst
    that arrives just before the next read leaves a backlog again. So an interval is
    judged only when the work that reached the queue (what it sent, what it still holds
    at the end, what it dropped) was at least what its rate could send in the interval:
    less, and it must have idled (such an interval read 15% and alone made a faithful
    run's 9 s of backlog read 64%; on netem, when netem was the class's leaf, a packet
    held for its delay read as a backlog the same way: now the queue read is the
    shaper's own on both backends, testbed/net/tc.py). Nor is one whose first read found less queued than the rate
    could send in the interval and which dropped nothing: the queue may have emptied
    and a burst arrived late in it (0.8 MB at the start, 8 MB at the end at 0.08 Gbit/s,
    5 MB a half second: it read 28% and alone made a faithful run's 5 s of backlog read
    92%). A shaper that is slow under load still shows: its queue grows past what the
    rate sends in an interval, or it drops the work it did not send. An interval whose
    ends read different
    configured rates is not judged: the rate changed somewhere inside it, and set against
    either rate its delivery says nothing of the shaper (a step from 0.08 to 1 Gbit/s
    0.1 s before the second read delivered 18% of the higher rate, and alone made a
    faithful 8 s backlog read 63%)."""
    by: dict[tuple[str, str], list] = {}
    for s in sorted(links, key=lambda s: s.t_mono):
        by.setdefault((s.link, s.direction), []).append(s)
    out = {}
    for (link, direction), rows in by.items():
        secs = bits = allowed = 0.0
        for a, b in zip(rows, rows[1:]):
            if window is not None and not (window[0] <= a.t_mono and b.t_mono <= window[1]):
                continue
            if not a.emulated_rate_gbit or a.backlog_bytes is None or b.backlog_bytes is None \
                    or min(a.backlog_bytes, b.backlog_bytes) <= QUEUED_MIN_BYTES:
                continue
            if b.emulated_rate_gbit is not None and b.emulated_rate_gbit != a.emulated_rate_gbit:
                continue
            dt = b.t_mono - a.t_mono
            if dt <= 0 or b.bytes < a.bytes:
                continue
            sent, pkts = b.bytes - a.bytes, b.packets - a.packets
            dropped = max(0, b.drops - a.drops) * (sent / pkts if pkts > 0 else 1500)
            cap = dt * a.emulated_rate_gbit * 1e9 / 8
            if sent + b.backlog_bytes + dropped < cap:
                continue  # less work reached it than its rate could send: it idled inside
            if a.backlog_bytes < cap and not dropped:
                continue  # it may have emptied before a late burst
            secs += dt
            bits += (b.bytes - a.bytes) * 8
            allowed += dt * a.emulated_rate_gbit * 1e9
        if secs > 0:
            out[f"{link}/{direction}"] = {"backlogged_s": round(secs, 3),
                                          "delivered_ratio": round(bits / allowed, 4)}
    return out


# -- compute ---------------------------------------------------------------
def role_figures(rows: Sequence[dict], window) -> dict | None:
    """One role instance's pacer and loop-lag figures over the window (its processes
    summed: a restarted instance appends snapshots under a new pid)."""
    by_pid: dict[int, list[dict]] = {}
    for r in sorted(rows, key=lambda r: r["t_mono"]):
        by_pid.setdefault(r["pid"], []).append(r)
    steps = overruns = 0
    overrun_s = modeled_s = 0.0
    lags, gcs, has_pacer = [], [], False
    for rs in by_pid.values():
        if window is not None and rs[-1]["t_mono"] < window[0]:
            continue  # a process that ended before the workload started
        a, b = _around(rs, window)
        first = a is not b
        lags.append(difference(b["loop_lag"], a["loop_lag"] if first else None))
        if b.get("gc_pause"):  # absent in runs made before the probe counted gc pauses
            gcs.append(difference(b["gc_pause"], a["gc_pause"] if first and a.get("gc_pause")
                                  else None))
        if b.get("pacer"):
            has_pacer = True
            pa = a["pacer"] if first and a.get("pacer") else {}
            steps += b["pacer"]["n_steps"] - pa.get("n_steps", 0)
            overruns += b["pacer"]["n_overruns"] - pa.get("n_overruns", 0)
            overrun_s += b["pacer"]["overrun_s"] - pa.get("overrun_s", 0.0)
            modeled_s += b["pacer"]["modeled_s"] - pa.get("modeled_s", 0.0)
    if not by_pid:
        return None
    lag = merge(lags)
    out = {"role": rows[0].get("role"), "processes": len(by_pid),
           "loop_lag_p50_ms": quantile_ms(lag, 0.5), "loop_lag_p99_ms": quantile_ms(lag, 0.99),
           "loop_lag_max_ms": lag["max_ms"] if lag["n"] else None}
    if gcs:  # not judged: it tells how much of the loop's lag the garbage collector made
        pauses = merge(gcs)
        out.update(gc_pauses=pauses["n"], gc_pause_p99_ms=quantile_ms(pauses, 0.99),
                   gc_pause_s=round(pauses["sum_ms"] / 1000.0, 4))
    last = max(rows, key=lambda r: r["t_mono"])
    if "sched" in last:  # not judged: the scheduler hints the process got (pdd.run.sched)
        out["sched"] = last["sched"]
    if has_pacer:
        out.update(steps=steps, overrun_step_share=round(overruns / steps, 4) if steps else None,
                   overrun_s=round(overrun_s, 3),
                   overrun_time_share=round(overrun_s / modeled_s, 4) if modeled_s > 0 else None)
    return out


# -- host ------------------------------------------------------------------
def host_figures(rows: Sequence[dict], window) -> dict | None:
    ends = _around(sorted(rows, key=lambda r: r["t_mono"]), window)
    if ends is None:
        return None
    a, b = ends
    busy = [(bb - ab) / (bt - at) if bt > at else None for ab, bb, at, bt in
            zip(a["cpu_busy"], b["cpu_busy"], a["cpu_total"], b["cpu_total"])]
    inside = [r for r in rows if window is None or window[0] <= r["t_mono"] <= window[1]] or [b]
    peak = max(r["mem_used_bytes"] for r in inside)
    out = {"cpu_busy_share": [None if x is None else round(x, 3) for x in busy],
           "mem_peak_bytes": peak,
           "mem_peak_share": round(peak / b["mem_total_bytes"], 4)}
    steal = steal_figures(rows, a, b, window[0] if window else a["t_mono"])
    if steal is not None:
        out.update(steal)
    return out


def steal_figures(rows: Sequence[dict], a: dict, b: dict, t0: float) -> dict | None:
    """The share of each core's time its hypervisor took (steal) from snapshot a to b, and
    the largest share one core lost over one sampling interval between them, with that
    interval's end in seconds after t0 (the workload's start). Steal is a virtual
    machine's stall, which every process on it sees at once; not judged (the lag and
    lateness it causes are). None for a run directory without ``cpu_steal``."""
    span = [r for r in rows if a["t_mono"] <= r["t_mono"] <= b["t_mono"]]
    if not span or any("cpu_steal" not in r for r in span):
        return None
    share = [(sb - sa) / (tb - ta) if tb > ta else None for sa, sb, ta, tb in
             zip(a["cpu_steal"], b["cpu_steal"], a["cpu_total"], b["cpu_total"])]
    worst, worst_t = 0.0, t0
    for p, q in zip(span, span[1:]):
        for sp, sq, tp, tq in zip(p["cpu_steal"], q["cpu_steal"], p["cpu_total"], q["cpu_total"]):
            if tq > tp and (sq - sp) / (tq - tp) > worst:
                worst, worst_t = (sq - sp) / (tq - tp), q["t_mono"]
    return {"cpu_steal_share": [None if x is None else round(x, 4) for x in share],
            "cpu_steal_worst_share": round(worst, 3),
            "cpu_steal_worst_at_s": round(worst_t - t0, 1)}


# -- the verdict ----------------------------------------------------------------
def judge(fig: Mapping, tol: Tolerances = TOLERANCES) -> list[str]:
    """The reasons one mode's figures are degraded (empty: faithful)."""
    out = []
    net, comp, host = fig.get("network") or {}, fig.get("compute") or {}, fig.get("host") or {}
    for cid, d in (net.get("delay_lines") or {}).items():
        p99 = d.get("lateness_p99_ms")
        if p99 is not None and p99 > tol.delay_lateness_p99_ms:
            out.append(f"network: delay line {cid} lateness p99 {p99:.2f} ms > "
                       f"{tol.delay_lateness_p99_ms:g} ms")
    frames = sum(d.get("frames", 0) for d in (net.get("delay_lines") or {}).values())
    drops = sum(d.get("unexplained_drops", 0) for d in (net.get("delay_lines") or {}).values())
    unanswered = sum(d.get("unanswered", 0) for d in (net.get("delay_lines") or {}).values())
    if frames and drops / frames > tol.unexplained_drop_share:
        out.append(f"network: {drops} drops no configured loss explains ({drops / frames:.2%} "
                   f"of {frames} frames > {tol.unexplained_drop_share:.2%})")
    if unanswered:
        out.append(f"network: delay lines left {unanswered} stats requests unanswered (0.5 s)")
    rtt = net.get("rtt") or {}
    if rtt.get("excess_p50_ms") is not None:
        lim = tol.rtt_excess_p50_ms + rtt.get("configured_jitter_ms", 0.0)
        if abs(rtt["excess_p50_ms"]) > lim:
            out.append(f"network: live RTT excess p50 {rtt['excess_p50_ms']:+.2f} ms over the "
                       f"configured RTT and queueing (|.| > {lim:g} ms)")
    for cid, d in (net.get("shapers") or {}).items():
        if d["backlogged_s"] >= tol.shaper_min_backlogged_s and \
                d["delivered_ratio"] < tol.shaper_min_ratio:
            out.append(f"network: shaper {cid} delivered {d['delivered_ratio']:.1%} of its rate "
                       f"over {d['backlogged_s']:g} s backlogged (< {tol.shaper_min_ratio:.0%})")
    for name, r in (comp.get("roles") or {}).items():
        share = r.get("overrun_time_share")
        if share is not None and share > tol.overrun_time_share:
            out.append(f"compute: {name} overran its modeled time by {share:.1%} "
                       f"({r['overrun_step_share']:.0%} of {r['steps']} steps; tolerance "
                       f"{tol.overrun_time_share:.0%})")
        lag = r.get("loop_lag_p99_ms")
        if lag is not None and lag > tol.loop_lag_p99_ms:
            out.append(f"compute: {name} event loop lag p99 {lag:.1f} ms > "
                       f"{tol.loop_lag_p99_ms:g} ms")
    busy = [x for x in host.get("cpu_busy_share") or [] if x is not None]
    if busy and max(busy) > tol.cpu_busy_share:
        out.append(f"host: busiest core {max(busy):.0%} busy > {tol.cpu_busy_share:.0%}")
    if host.get("mem_peak_share") is not None and host["mem_peak_share"] > tol.memory_share:
        out.append(f"host: peak memory {host['mem_peak_share']:.0%} of the machine's > "
                   f"{tol.memory_share:.0%}")
    return out


def probe_hosts(topology: Mapping) -> tuple[str, str] | None:
    """The RTT probe's hosts (testbed/scenario/runner.py probe_hosts): the client's in the
    first datacenter and MD's in the second, from metadata.json's topology."""
    dcs = topology.get("datacenters") or []
    if len(dcs) != 2:
        return None

    def pick(dc, role):
        hosts = dc.get("hosts") or []
        return next((h["name"] for h in hosts if role in h.get("roles", ())),
                    hosts[0]["name"] if hosts else None)

    a, b = pick(dcs[0], "client"), pick(dcs[1], "main_decode")
    return (a, b) if a and b else None


def role_stats(mode_dir: Path) -> dict[str, list[dict]]:
    """Every role instance's probe snapshots in a mode's folder (``roles/NAME.stats.jsonl``):
    instance name -> its rows, in file order."""
    return {p.name[: -len(".stats.jsonl")]: _read_jsonl(p)
            for p in sorted((mode_dir / "roles").glob("*.stats.jsonl"))}


def mode_fidelity(mode_dir: Path, events, links, topology: Mapping, window,
                  path_hosts: tuple[str, str] | None = None) -> dict:
    """One mode's fidelity entry: figures, verdict and reasons."""
    ping = mode_dir / "ping.txt"
    roles = {}
    for name, rows in role_stats(mode_dir).items():
        fig = role_figures(rows, window)
        if fig is not None:
            roles[name] = fig
    fig = {
        "network": {"delay_lines": delay_line_figures(_read_jsonl(mode_dir / "delaylines.jsonl"),
                                                      window, events),
                    "rtt": rtt_figures(ping.read_text() if ping.is_file() else None, events,
                                       links, topology, window, path_hosts),
                    "shapers": shaper_figures(links, window)},
        "compute": {"roles": roles},
        "host": host_figures(_read_jsonl(mode_dir / "host.jsonl"), window),
    }
    reasons = judge(fig)
    measured = bool(roles) or fig["host"] is not None
    verdict = (DEGRADED if reasons else FAITHFUL) if measured else None
    return {"verdict": verdict, "reasons": reasons, **fig}


def combine(modes: Mapping[str, dict], policy: str = "report") -> dict:
    """The run's verdict: degraded if any mode is, null if no mode was measured;
    ``policy`` is the scenario's ``fidelity`` (strict: degraded exits 2)."""
    verdicts = [m["verdict"] for m in modes.values() if m["verdict"] is not None]
    verdict = None if not verdicts else DEGRADED if DEGRADED in verdicts else FAITHFUL
    return {"verdict": verdict, "policy": policy,
            "reasons": [f"{name}: {r}" for name, m in modes.items() for r in m["reasons"]],
            "host_steal": host_steal(modes),
            "tolerances": TOLERANCES.__dict__.copy(), "modes": dict(modes)}


PARTS = ("network", "compute", "host")


def by_part(fid: Mapping) -> dict[str, dict]:
    """The run's verdict split by what was late: per part (network, compute, host) its
    own verdict (degraded when a reason names it) and reasons, each still prefixed
    with its mode. A run whose compute overran under software emulation can still
    say its network was emulated faithfully."""
    out = {}
    for part in PARTS:
        reasons = [r for r in fid.get("reasons") or []
                   if r.partition(": ")[2].startswith(part + ":")]
        verdict = None if fid.get("verdict") is None else DEGRADED if reasons else FAITHFUL
        out[part] = {"verdict": verdict, "reasons": reasons}
    return out


def host_steal(modes: Mapping[str, dict]) -> dict | None:
    """The mode whose cores lost the most time to the hypervisor (its cores' mean steal
    share) and the worst core over one sample in any mode; None without steal figures.
    Shown beside the verdict: a stolen interval makes every process late at once."""
    shares = {}
    for name, m in modes.items():
        st = [x for x in ((m.get("host") or {}).get("cpu_steal_share") or []) if x is not None]
        if st:
            shares[name] = sum(st) / len(st)
    if not shares:
        return None
    top = max(shares, key=shares.get)
    worst = max((m.get("host") or {}).get("cpu_steal_worst_share") or 0.0 for m in modes.values())
    return {"share": round(shares[top], 4), "mode": top, "worst_share": worst}


def steal_line(fid: Mapping) -> str | None:
    """One line on the hypervisor's steal for a degraded run whose cores lost at least
    ``STEAL_NOTE_SHARE`` of their time, else None (a faithful run needs no excuse)."""
    st = fid.get("host_steal")
    if fid.get("verdict") != DEGRADED or not st or st["share"] < STEAL_NOTE_SHARE:
        return None
    return (f"host: the hypervisor took {st['share']:.1%} of the cores' time in {st['mode']} "
            f"(steal; worst core over one sample {st['worst_share']:.0%}): the likelier cause "
            f"is the host's stalls, not the testbed's load (docs/design.md, \"When the host "
            f"is late\")")
