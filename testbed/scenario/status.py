"""The live status line and progress bar of ``testbed run`` (stderr).

Owns only presentation: time since the workload started, requests done /
in flight / total as a bar, the WAN's current rate (emulated, and nominal =
emulated x k) and the faults active now. On a terminal the line is
redrawn in place; otherwise a line is printed every 5 s.
"""

from __future__ import annotations

import sys

BAR = 24


class Status:
    def __init__(self, mode: str, workload, roles, sampler, faults):
        self.mode, self.roles, self.sampler, self.faults = mode, roles, sampler, faults
        self.arrivals = sorted(r.arrival_s for r in workload.requests)
        self.total = len(self.arrivals)
        self.tty = sys.stderr.isatty()
        self.last_print = -1e9

    def _active(self, t: float) -> str:
        names = [f.kind for f in self.faults if f.trigger is None
                 and f.at_s <= t and f.end_s is not None and t < f.end_s]
        return ",".join(names) or "none"

    def line(self, t: float) -> str:
        done = self.roles.requests_done()
        sent = sum(1 for a in self.arrivals if a <= t)
        filled = int(BAR * done / max(self.total, 1))
        wan = self.sampler.wan_rate_gbit
        k = self.sampler.net.plan.scale
        return (f"[{self.mode}] {t:6.1f}s [{'#' * filled}{'-' * (BAR - filled)}] "
                f"{done}/{self.total} done, {max(sent - done, 0)} in flight | WAN "
                f"{wan:.3f} Gbit/s ({wan * k:.1f} nominal) | faults: {self._active(t)}")

    def show(self, t: float) -> None:
        if self.tty:
            sys.stderr.write("\r" + self.line(t)[:160].ljust(160))
            sys.stderr.flush()
        elif t - self.last_print >= 5.0:
            print(self.line(t), file=sys.stderr)
            self.last_print = t

    def finish(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
        print(f"[{self.mode}] finished: {self.roles.requests_done()}/{self.total} requests "
              f"recorded", file=sys.stderr)
