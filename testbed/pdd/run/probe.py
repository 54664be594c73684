"""A role process's own fidelity figures: its pacer's overruns and its event loop's lag.

Owns ``RoleProbe``: inside a role process it runs two asyncio tasks, a
loop-lag probe (sleeps ``LAG_PERIOD_S`` and records how much later than
asked it woke: the time a frame or a timer waited behind other work on the
loop) and a writer that appends one JSON line of cumulative counters to
the stats file every ``WRITE_EVERY_S`` and once more at stop::

    {"t_mono", "pid", "name", "role",
     "pacer": {"n_steps", "n_overruns", "overrun_s", "modeled_s"},   # null for router, client
     "loop_lag": {histogram: testbed.histogram},
     "gc_pause": {histogram},       # the cyclic garbage collector's pauses, any generation
     "gc_full_pause": {histogram},  # those of them that were full (generation 2)
     "sched": {"slice_ns", "nice", "rt_priority", "refused"},  # pdd.run.sched's hints or null
     "rss_mb": float, "fds": int,   # resident memory (VmRSS) and open descriptors, now
     "cpu_s": float, "run_delay_s": float}  # the main thread's CPU time, and its time
                                            # runnable but waiting for a core (schedstat)

A collection stops the whole process, loop included, for as long as it takes
to traverse the live containers, so a role holding many requests' token lists
can lag by its gc pauses alone: ``gc_pause`` says how much of the lag they are.

The counters are cumulative per process (a restarted instance appends with
a new pid and starts from zero), so the report takes the difference of the
snapshots around its workload window (testbed/report/fidelity.py); ``rss_mb``
and ``fds`` are gauges, read from /proc/self at each write, whose series over
a run give its memory and descriptor slopes (testbed/report/resources.py: a
leak shows as a slope that does not flatten). The file
is written by the role itself; the runner only names it (``--stats``).

Example::

    probe = RoleProbe(path, name="md1", role="main_decode", pacer=node.decoder.pacer)
    probe.start(); ...; await probe.stop()
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from pathlib import Path

from testbed.histogram import LatencyHistogram
from testbed.pdd.compute.pacing import AsyncPacer

LAG_PERIOD_S = 0.02
WRITE_EVERY_S = 1.0


class RoleProbe:
    """Loop lag and pacer counters of one role process, appended to a JSONL file."""

    def __init__(self, path: str | Path, name: str, role: str, pacer: AsyncPacer | None = None,
                 clock=time.monotonic, sched: dict | None = None):
        self.path, self.name, self.role, self.pacer = Path(path), name, role, pacer
        self.sched = sched
        self.lag = LatencyHistogram()
        self.gc_pause = LatencyHistogram()
        self.gc_full_pause = LatencyHistogram()
        self._clock = clock
        self._tasks: list[asyncio.Task] = []
        self._gc_t0: float | None = None

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0 is not None:
            ms = (time.perf_counter() - self._gc_t0) * 1000.0
            self.gc_pause.add_ms(ms)
            if info.get("generation") == 2:
                self.gc_full_pause.add_ms(ms)
            self._gc_t0 = None

    def snapshot(self) -> dict:
        st = self.pacer.stats if self.pacer is not None else None
        pacer = None if st is None else {
            "n_steps": st.n_steps, "n_overruns": st.n_overruns,
            "overrun_s": round(st.overrun_s, 6), "modeled_s": round(st.modeled_s, 6)}
        return {"t_mono": round(self._clock(), 4), "pid": os.getpid(), "name": self.name,
                "role": self.role, "pacer": pacer, "loop_lag": self.lag.to_dict(),
                "gc_pause": self.gc_pause.to_dict(),
                "gc_full_pause": self.gc_full_pause.to_dict(), "sched": self.sched,
                "rss_mb": rss_mb(), "fds": open_fds(), **sched_times()}

    def write(self) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(self.snapshot()) + "\n")

    async def _lag_loop(self) -> None:
        while True:
            t0 = self._clock()
            await asyncio.sleep(LAG_PERIOD_S)
            self.lag.add_ms((self._clock() - t0 - LAG_PERIOD_S) * 1000.0)

    async def _write_loop(self) -> None:
        while True:
            self.write()
            await asyncio.sleep(WRITE_EVERY_S)

    def start(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        self._tasks = [asyncio.create_task(self._lag_loop()),
                       asyncio.create_task(self._write_loop())]

    async def stop(self) -> None:
        """Stop both tasks and write the last snapshot."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        self._tasks = []
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self.write()


def rss_mb(pid: int | str = "self") -> float | None:
    """A process's resident memory (VmRSS) in MB; None when /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def sched_times(pid: int | str = "self") -> dict[str, float | None]:
    """A process's main thread's CPU time and run delay (time runnable, waiting for a core),
    cumulative seconds, from /proc/PID/schedstat; None each when the kernel does not say.
    Their differences over an interval tell a loop that lagged because it had work
    (cpu_s grew) from one that lagged because it had no core (run_delay_s grew)."""
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            ran_ns, waited_ns = (int(x) for x in fh.read().split()[:2])
    except (OSError, ValueError):
        return {"cpu_s": None, "run_delay_s": None}
    return {"cpu_s": round(ran_ns / 1e9, 6), "run_delay_s": round(waited_ns / 1e9, 6)}


def open_fds(pid: int | str = "self") -> int | None:
    """How many file descriptors a process holds open; None when /proc does not say."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def pacer_of(node: object) -> AsyncPacer | None:
    """The pacer of a role object: P's own, RLD's and MD's decode loop's; None for the router."""
    pacer = getattr(node, "pacer", None)
    if pacer is None:
        pacer = getattr(getattr(node, "decoder", None), "pacer", None)
    return pacer if isinstance(pacer, AsyncPacer) else None
