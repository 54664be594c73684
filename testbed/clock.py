"""The one clock every role reads: the running event loop's.

Owns ``now`` (seconds on the running loop's clock), ``perf`` (a timer for
what real work costs) and ``wall_ns`` (an epoch in nanoseconds, for ids
that must grow across restarts). On asyncio's own loop ``now`` is
``time.monotonic()`` (that is what ``loop.time()`` returns), so role
processes on the emulator read the machine's clock as before; on a virtual
loop (``testbed.pdd.run.vloop.VirtualClockLoop``, which sets
``virtual_clock = True``) they read simulated time, and the same code
runs on a clock that jumps to the next event.

No role reads ``time.monotonic``, ``time.time`` or ``time.perf_counter``
itself (tests/unit/test_clock.py checks the role packages): a wall-clock
read would let real CPU time leak into simulated time and make two virtual
runs differ. Outside a running loop (a synchronous helper called from a
test) ``now`` falls back to ``time.monotonic()``.

Example::

    from testbed.clock import now
    t0 = now(); await asyncio.sleep(0.5); assert now() - t0 >= 0.5
"""

from __future__ import annotations

import asyncio
import time


def _loop():
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def now() -> float:
    """Seconds on the running loop's clock (``time.monotonic()`` without one)."""
    loop = _loop()
    return loop.time() if loop is not None else time.monotonic()


def is_virtual() -> bool:
    """Whether the running loop's clock is simulated."""
    return bool(getattr(_loop(), "virtual_clock", False))


def perf() -> float:
    """A timer for real work (``time.perf_counter``); on a virtual loop its simulated time,
    so work that takes no simulated time measures 0 and a run stays reproducible."""
    loop = _loop()
    if getattr(loop, "virtual_clock", False):
        return loop.time()
    return time.perf_counter()


def wall_ns() -> int:
    """Nanoseconds since the epoch (``time.time_ns()``); on a virtual loop its fixed
    epoch plus its simulated time, so ids drawn from it repeat from run to run."""
    loop = _loop()
    if getattr(loop, "virtual_clock", False):
        return loop.epoch_ns + int(round(loop.time() * 1e9))
    return time.time_ns()
