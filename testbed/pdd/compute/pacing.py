"""Padding of real compute to modeled time, for roles on an event loop.

Owns ``AsyncPacer``, the one pacer, and ``PacerStats``: a role computes for
real, then sleeps until the modeled time (``modeled_s * time_scale``,
TimingConfig.time_scale) has passed; when the real compute was longer it
records an overrun (not carried: the next step starts on its own). Sleep
overshoot (the OS waking late) is carried to the next step, so a long run of
short steps keeps to the modeled timeline. It sleeps with ``asyncio.sleep``
so other roles and connections sharing the loop keep running while a role
"computes". The clock (default ``testbed.clock.now``: the loop's) and the sleep are
injectable (tests use a fake time).

Example::

    pacer = AsyncPacer(time_scale=0.5)
    t0 = now(); logits = model.decode_step(cache, tok)
    await pacer.pad(cost.decode_step_s(1, 300), now() - t0)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable

from testbed.clock import now as loop_now


@dataclass
class PacerStats:
    """What a pacer has done so far; overruns are steps whose real compute exceeded the model."""

    n_steps: int = 0
    n_overruns: int = 0
    overrun_s: float = 0.0
    modeled_s: float = 0.0
    slept_s: float = 0.0


class AsyncPacer:
    """Pads each step to ``modeled_s * time_scale`` (see the module docstring)."""

    def __init__(self, time_scale: float = 1.0, clock: Callable[[], float] = loop_now,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.time_scale = time_scale
        self.stats = PacerStats()
        self._late_s = 0.0
        self._clock, self._sleep = clock, sleep

    async def pad(self, modeled_s: float, real_s: float) -> bool:
        """Sleep until the scaled modeled time has passed; return True on an overrun."""
        target = modeled_s * self.time_scale
        st = self.stats
        st.n_steps += 1
        st.modeled_s += target
        if real_s > target:
            st.n_overruns += 1
            st.overrun_s += real_s - target
            await self._sleep(0)  # let the loop breathe even when compute overran
            return True
        wait_s = target - real_s - self._late_s
        if wait_s <= 0:
            self._late_s = -wait_s
            await self._sleep(0)
            return False
        before = self._clock()
        await self._sleep(wait_s)
        slept = self._clock() - before
        self._late_s = max(0.0, slept - wait_s)
        st.slept_s += slept
        return False
