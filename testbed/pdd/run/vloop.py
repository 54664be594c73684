"""An asyncio event loop on a virtual clock: time jumps to the next timer.

Owns ``VirtualClockLoop``, ``run_virtual`` and ``Stalled``. The loop's
``time()`` is simulated seconds from 0; when no callback is ready, the loop
does not block but moves its clock to the earliest scheduled timer and runs
it. So ``await asyncio.sleep(3600)`` returns at once with ``loop.time()``
3,600 s later, and what the roles compute for real costs no simulated time:
only their modeled sleeps (``AsyncPacer``), the network model's delays and
the workload's arrivals move the clock. Everything that reads
``testbed.clock`` (every role) reads this time.

Rules that keep a run exact and repeatable:

- No real I/O drives the run: roles talk through an in-process transport
  (``testbed.pdd.wire.fluid_net``, or the fake transport). Real file
  descriptors still work (the loop polls them, without waiting, whenever
  nothing else is ready), but a wait on one does not move the clock.
- ``run_in_executor`` (and so ``asyncio.to_thread``) runs the function at
  once, on the loop's thread: a thread's completion would come at a real
  time the simulation cannot place.
- When nothing is ready and no timer is set, every task waits for
  something that cannot happen: ``Stalled`` is raised (a deadlock, named,
  rather than a hang).
- One loop and no threads: same inputs, same seeds, same interleaving,
  so two runs give the same output.
- Ties. Timers due at the same simulated instant (16 requests of a trace
  that arrive together, a KV segment and a decode step) would run in the
  order they were scheduled; on a real machine microseconds of noise
  decide, and that order matters (it is the order of P's queue). With a
  ``tie_seed`` every timer is set ``TIE_S`` x U(0, 1) later, drawn from
  that seed: a tie is broken at random, the same way each run of the same
  seed, and runs on other tie seeds sample the orders the emulator's
  noise would. ``tie_seed=None``: scheduling order, no draw.

Example::

    async def main():
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == 3600.0      # in milliseconds of wall time
"""

from __future__ import annotations

import asyncio
import heapq
import random
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# the epoch of a virtual run's ``testbed.clock.wall_ns`` (2026-01-01T00:00:00Z): fixed, so
# ids drawn from it repeat from run to run
VIRTUAL_EPOCH_NS = 1_767_225_600 * 10**9
TIE_S = 1e-6  # the most a timer is moved to break ties (a real loop's noise is ~us)


class Stalled(RuntimeError):
    """Every task waits and no timer is set: nothing can happen any more."""


class _VirtualSelector(selectors.BaseSelector):
    """A selector that polls real descriptors without waiting; a wait becomes a jump of
    the loop's clock to its next timer."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.loop: VirtualClockLoop | None = None

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def get_key(self, fileobj):
        return self._real.get_key(fileobj)

    def get_map(self):
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout=None):
        if timeout == 0:  # callbacks are ready: real descriptors wait for the next jump
            return []
        ready = self._real.select(0)
        if ready:
            return ready
        loop = self.loop
        if timeout is None:
            raise Stalled(f"virtual clock stalled at {loop.time():.6f} s: every task waits "
                          "and no timer is set")
        loop._jump()
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is simulated (see the module docstring)."""

    virtual_clock = True
    epoch_ns = VIRTUAL_EPOCH_NS

    def __init__(self, tie_seed: int | None = None) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = 0.0
        self._ties = None if tie_seed is None else random.Random(tie_seed)
        self.jumps = 0  # how many times the clock moved: the run's timer events

    def call_at(self, when, callback, *args, context=None):
        if self._ties is not None:
            when += self._ties.random() * TIE_S
        return super().call_at(when, callback, *args, context=context)

    def time(self) -> float:
        return self._virtual_now

    def _jump(self) -> None:
        """Move the clock to the earliest timer that is not cancelled."""
        scheduled = self._scheduled
        while scheduled and scheduled[0]._cancelled:
            scheduled[0]._scheduled = False
            heapq.heappop(scheduled)
            self._timer_cancelled_count -= 1
        if not scheduled:
            raise Stalled(f"virtual clock stalled at {self._virtual_now:.6f} s: every task "
                          "waits and no timer is set")
        when = scheduled[0]._when
        if when > self._virtual_now:
            self._virtual_now = when
            self.jumps += 1

    def run_in_executor(self, executor, func, *args):
        future = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as err:  # the caller awaits it, as from a thread
            future.set_exception(err)
        return future


def run_virtual(main: Coroutine[Any, Any, T], tie_seed: int | None = None) -> T:
    """Run ``main`` to completion on a fresh ``VirtualClockLoop`` (as ``asyncio.run``)."""
    with asyncio.Runner(loop_factory=lambda: VirtualClockLoop(tie_seed)) as runner:
        return runner.run(main)
