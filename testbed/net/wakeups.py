"""How late this host wakes a real-time thread: the floor under the delay lines' lateness.

Owns ``measure_wakeups`` (``testbed check`` runs it) and ``read_steal``. A
userspace delay line sleeps until its next frame is due and is judged by
how late the frame leaves (docs/design.md, "The fidelity verdict": p99 at
most 1 ms). Its own code cannot do better than the host wakes it. This
measures that floor with nothing else running: one thread at the delay
lines' SCHED_FIFO priority (where permitted) sleeps for random spans like
a delay line's waits (uniform in ``lo_ms``..``hi_ms``) and records how late
each sleep ends, while /proc/stat's steal counts the time the hypervisor
ran something else on this virtual machine's cores.

Why it exists: on a shared virtual machine (the 2-core machines this
project is developed on) an idle real-time thread wakes more than 1 ms late
after a few percent of its 5-50 ms sleeps at some moments and after almost
none at others (docs/design.md, "When the host is late"). A run's delay
lines then read a lateness p99 above 1 ms, most readily when their traffic
is sparse (each frame its own wake-up), and the verdict says degraded
because the host did not keep the emulated timing, not because the
testbed's code fell behind. The figure is one moment's: the host's noise
changes from minute to minute.

Example::

    w = measure_wakeups(seconds=10)
    w["p99_ms"], w["over_1ms_share"], w["steal_share"], w["realtime"]
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

from testbed.histogram import percentile
from testbed.net.delayline import RT_PRIORITY

LATE_MS = 1.0  # the delay lines' lateness tolerance (testbed.report.fidelity)


def read_steal(proc: Path = Path("/proc")) -> tuple[int, int]:
    """(steal, total) jiffies over all cores from /proc/stat's aggregate ``cpu`` line."""
    for line in (proc / "stat").read_text().splitlines():
        name, *vals = line.split()
        if name == "cpu":
            v = [int(x) for x in vals[:8]] + [0] * 8
            return v[7], sum(v[:8])
    raise ValueError(f"{proc / 'stat'}: no aggregate cpu line")


def summarize(late_ms: list[float], realtime: bool, steal_share: float | None,
              lo_ms: float, hi_ms: float) -> dict:
    """The figures of one measurement from each sleep's lateness (ms)."""
    n = len(late_ms)
    return {"sleeps": n, "sleep_ms": [lo_ms, hi_ms], "realtime": realtime,
            "p50_ms": round(percentile(late_ms, 50), 3) if n else None,
            "p99_ms": round(percentile(late_ms, 99), 3) if n else None,
            "max_ms": round(max(late_ms), 3) if n else None,
            "over_1ms_share": round(sum(x > LATE_MS for x in late_ms) / n, 4) if n else None,
            "steal_share": None if steal_share is None else round(steal_share, 4)}


def measure_wakeups(seconds: float = 10.0, lo_ms: float = 1.0, hi_ms: float = 50.0,
                    seed: int = 1, priority: int = RT_PRIORITY) -> dict:
    """Sleep random spans for ``seconds`` on a thread at SCHED_FIFO ``priority`` (if
    permitted; ``realtime`` says) and report how late the sleeps ended."""
    if not 0 < lo_ms <= hi_ms:
        raise ValueError(f"sleep span {lo_ms}..{hi_ms} ms: need 0 < lo <= hi")
    late: list[float] = []
    rt = [False]

    def sleeper() -> None:
        try:  # pid 0: this thread only
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
            rt[0] = True
        except (OSError, AttributeError):
            pass
        rng = random.Random(seed)
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            due = time.monotonic() + rng.uniform(lo_ms, hi_ms) / 1000.0
            left = due - time.monotonic()
            if left > 0:
                time.sleep(left)
            late.append((time.monotonic() - due) * 1000.0)

    steal0 = _steal_or_none()
    t = threading.Thread(target=sleeper, name="wakeups", daemon=True)
    t.start()
    t.join()
    steal1 = _steal_or_none()
    share = None
    if steal0 and steal1 and steal1[1] > steal0[1]:
        share = (steal1[0] - steal0[0]) / (steal1[1] - steal0[1])
    return summarize(late, rt[0], share, lo_ms, hi_ms)


def _steal_or_none() -> tuple[int, int] | None:
    try:
        return read_steal()
    except (OSError, ValueError):
        return None


def format_wakeups(w: dict) -> list[str]:
    """``testbed check``'s lines for one measurement."""
    lo, hi = w["sleep_ms"]
    how = "SCHED_FIFO" if w["realtime"] else "normal priority (not root)"
    steal = "-" if w["steal_share"] is None else f"{w['steal_share']:.1%}"
    verdict = ("within the delay lines' 1 ms p99" if w["p99_ms"] is not None
               and w["p99_ms"] <= LATE_MS else
               "over the delay lines' 1 ms p99: runs with sparse WAN traffic will read "
               "degraded on lateness however the testbed behaves")
    return [f"wake-ups       {w['sleeps']} sleeps of {lo:g}-{hi:g} ms, {how}: late p50 "
            f"{w['p50_ms']:.3f} / p99 {w['p99_ms']:.3f} / max {w['max_ms']:.3f} ms, "
            f"{w['over_1ms_share']:.1%} over 1 ms; CPU steal {steal}",
            f"               {verdict}"]
