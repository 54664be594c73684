"""links.csv: cumulative bytes/packets/drops of every shaped channel over time.

Owns the link byte accounting of a run (htb class counters, read through
pyroute2 in each namespace). The runner calls ``sample()`` from its loop
every SAMPLE_EVERY_S; each call appends one row per channel.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

from testbed.net import runtime

SAMPLE_EVERY_S = 0.5
HEADER = ("t_mono", "link", "direction", "bytes", "packets", "drops", "nominal_rate_gbit",
          "emulated_rate_gbit")


class LinkSampler:
    def __init__(self, net, path: Path):
        self.net = net
        self._fh = path.open("w", newline="")
        self._w = csv.writer(self._fh)
        self._w.writerow(HEADER)
        self.last: dict[str, tuple[float, int]] = {}
        self.wan_rate_gbit = 0.0  # a>b, emulated, over the last interval

    def sample(self) -> None:
        t = time.monotonic()
        for cid, counters in runtime.channel_counters(self.net).items():
            ch = self.net.channels[cid]
            self._w.writerow((f"{t:.4f}", ch.link, ch.direction, counters["bytes"],
                              counters["packets"], counters["drops"], ch.spec.rate_gbit,
                              ch.htb.emulated_gbit))
            if cid == "wan/a>b":
                if cid in self.last:
                    t0, b0 = self.last[cid]
                    self.wan_rate_gbit = (counters["bytes"] - b0) * 8 / max(t - t0, 1e-6) / 1e9
                self.last[cid] = (t, counters["bytes"])
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
