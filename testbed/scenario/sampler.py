"""links.csv: cumulative bytes/packets/drops of every shaped channel over time.

Owns the link byte accounting of a run (htb class counters, read through
pyroute2 in each namespace). The runner calls ``sample()`` from its loop
every SAMPLE_EVERY_S; each call appends one row per channel.

Each row's ``t_mono`` is the midpoint of *that channel's* counter read, not
one time for the whole sample: the reads go one namespace after another and
one can take tens of ms on a loaded machine, so a single timestamp taken
before them all put a later channel's counter up to the whole read time off
its row, and a rate computed between two rows came out above the shaper's
(13.5 Gbit/s nominal on a 10 Gbit/s WAN, measured 2026-11). With per-read times the
error of a rate over an interval is at most one read's duration over the
interval (``read_s`` records it). ``backlog_bytes`` is what the channel's
leaf qdisc held at the read: a channel whose queue stays non-empty is
limited by its shaper, and its rate then is the shaper's delivered rate.

Beside links.csv the same calls write ``host.jsonl`` (per-core CPU jiffies
and memory in use) and, with the userspace backend, ``delaylines.jsonl``
(each delay line's stats, its frames' lateness among them): the raw
figures of the run's fidelity verdict (testbed/report/fidelity.py).
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import time
from pathlib import Path

from testbed.net import runtime

SAMPLE_EVERY_S = 0.5
HEADER = ("t_mono", "link", "direction", "bytes", "packets", "drops", "nominal_rate_gbit",
          "emulated_rate_gbit", "read_s", "backlog_bytes")


class LinkSampler:
    """links.csv, and beside it the host's and the delay lines' counters (``host.jsonl``,
    ``delaylines.jsonl``: the run's fidelity figures, testbed/report/fidelity.py)."""

    def __init__(self, net, path: Path):
        self.net = net
        self._host = HostSampler(path.with_name("host.jsonl"))
        self._lines = path.with_name("delaylines.jsonl").open("w") \
            if getattr(net, "delay_lines", None) else None
        self._fh = path.open("w", newline="")
        self._w = csv.writer(self._fh)
        self._w.writerow(HEADER)
        self.last: dict[str, tuple[float, int]] = {}
        self.wan_rate_gbit = 0.0  # a>b, emulated, over the last interval

    def sample(self) -> None:
        for cid, ch in self.net.channels.items():
            t0 = time.monotonic()
            counters = runtime.channel_counter(self.net, cid)
            t1 = time.monotonic()
            t = (t0 + t1) / 2  # the kernel read its counters somewhere in [t0, t1]
            self._w.writerow((f"{t:.4f}", ch.link, ch.direction, counters["bytes"],
                              counters["packets"], counters["drops"], ch.spec.rate_gbit,
                              ch.htb.emulated_gbit, f"{t1 - t0:.4f}",
                              counters.get("backlog", "")))
            if cid == "wan/a>b":
                if cid in self.last:
                    t0, b0 = self.last[cid]
                    self.wan_rate_gbit = (counters["bytes"] - b0) * 8 / max(t - t0, 1e-6) / 1e9
                self.last[cid] = (t, counters["bytes"])
        self._fh.flush()
        self._host.sample()
        if self._lines is not None:
            self._sample_delay_lines()

    def _sample_delay_lines(self) -> None:
        """Each delay line's cumulative stats (frames, drops, lateness histogram)."""
        from testbed.errors import EmulationError
        from testbed.net.delayline import DelayLineControl

        for cid, sock in self.net.delay_lines.items():
            try:
                stats = DelayLineControl(str(sock), timeout_s=0.5).stats()
            except EmulationError:  # a line that stalls past 0.5 s is itself a finding:
                stats = {"unanswered": True}  # the report counts it
            self._lines.write(json.dumps({"t_mono": round(time.monotonic(), 4),
                                          "channel": cid, **stats}) + "\n")
        self._lines.flush()

    def close(self) -> None:
        self._fh.close()
        self._host.close()
        if self._lines is not None:
            self._lines.close()


def read_proc_stat(text: str) -> tuple[list[int], list[int], list[int]]:
    """Per-core (busy, total, steal) jiffies from /proc/stat's ``cpuN`` lines (busy: all
    but idle and iowait; steal: time a virtual CPU was ready but its hypervisor ran
    something else, counted in busy too; 0 where the kernel does not report it)."""
    busy, total, steal = [], [], []
    for line in text.splitlines():
        name, *vals = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        v = [int(x) for x in vals[:8]]  # user nice system idle iowait irq softirq steal
        v += [0] * (8 - len(v))
        busy.append(sum(v) - v[3] - v[4])
        total.append(sum(v))
        steal.append(v[7])
    return busy, total, steal


def read_meminfo(text: str) -> tuple[int, int]:
    """(used, total) bytes from /proc/meminfo: used = MemTotal - MemAvailable."""
    kb = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            kb[key] = int(rest.split()[0])
    return (kb["MemTotal"] - kb["MemAvailable"]) * 1024, kb["MemTotal"] * 1024


class HostSampler:
    """``host.jsonl``: per-core busy, total and stolen jiffies (cumulative) and memory in
    use."""

    def __init__(self, path: Path, proc: Path = Path("/proc")):
        self._fh = path.open("w")
        self._proc = proc

    def sample(self) -> None:
        busy, total, steal = read_proc_stat((self._proc / "stat").read_text())
        used, mem_total = read_meminfo((self._proc / "meminfo").read_text())
        self._fh.write(json.dumps({"t_mono": round(time.monotonic(), 4), "cpu_busy": busy,
                                   "cpu_total": total, "cpu_steal": steal,
                                   "mem_used_bytes": used,
                                   "mem_total_bytes": mem_total}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


RTT_PROBE_INTERVAL_S = 0.2


class RttProbe:
    """``ping.txt``: one ICMP echo every RTT_PROBE_INTERVAL_S from the client's host to
    MD's over the WAN during the workload (``ping -D``: each reply with its wall-clock
    time), the live RTT the fidelity verdict compares with the configured one."""

    def __init__(self, net, src: str, dst: str, path: Path):
        self._fh = path.open("w")
        argv = ["ping", "-D", "-n", "-i", str(RTT_PROBE_INTERVAL_S), "-W", "2", net.ip(dst)]
        self.proc = net.popen(src, argv, what="rtt probe", stdout=self._fh,
                              stderr=subprocess.DEVNULL)

    def close(self) -> None:
        from testbed.net.registry import stop_process

        if self.proc.poll() is None:
            stop_process(self.proc.pid, None, timeout_s=2.0, first=signal.SIGINT)
        self._fh.close()
