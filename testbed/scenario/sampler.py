"""links.csv: cumulative bytes/packets/drops of every shaped channel over time.

Owns the link byte accounting of a run (htb class counters, read through
pyroute2 in each namespace). The runner calls ``sample()`` from its loop
every SAMPLE_EVERY_S; each call appends one row per channel.

Each row's ``t_mono`` is the midpoint of *that channel's* counter read, not
one time for the whole sample: the reads go one namespace after another and
one can take tens of ms on a loaded machine, so a single timestamp taken
before them all put a later channel's counter up to the whole read time off
its row, and a rate computed between two rows came out above the shaper's
(issue 10: 13.5 Gbit/s nominal on a 10 Gbit/s WAN). With per-read times the
error of a rate over an interval is at most one read's duration over the
interval (``read_s`` records it).
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

from testbed.net import runtime

SAMPLE_EVERY_S = 0.5
HEADER = ("t_mono", "link", "direction", "bytes", "packets", "drops", "nominal_rate_gbit",
          "emulated_rate_gbit", "read_s")


class LinkSampler:
    def __init__(self, net, path: Path):
        self.net = net
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
                              ch.htb.emulated_gbit, f"{t1 - t0:.4f}"))
            if cid == "wan/a>b":
                if cid in self.last:
                    t0, b0 = self.last[cid]
                    self.wan_rate_gbit = (counters["bytes"] - b0) * 8 / max(t - t0, 1e-6) / 1e9
                self.last[cid] = (t, counters["bytes"])
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
