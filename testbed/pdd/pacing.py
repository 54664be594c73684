"""Asynchronous padding of real compute to modeled time, for roles on an event loop.

Owns ``AsyncPacer``: the same accounting as ``costmodel.Pacer`` (overruns are
counted and not carried; sleep overshoot is carried to the next step) but it
sleeps with ``asyncio.sleep`` so other roles and connections sharing the
loop keep running while a role "computes". ``time_scale`` multiplies every
modeled duration (TimingConfig.time_scale).

Example::

    pacer = AsyncPacer(time_scale=0.5)
    t0 = time.monotonic(); logits = model.decode_step(cache, tok)
    await pacer.pad(cost.decode_step_s(1, 300), time.monotonic() - t0)
"""

from __future__ import annotations

import asyncio
import time

from testbed.pdd.costmodel import PacerStats


class AsyncPacer:
    """Pads each step to ``modeled_s * time_scale`` (see the module docstring)."""

    def __init__(self, time_scale: float = 1.0):
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.time_scale = time_scale
        self.stats = PacerStats()
        self._late_s = 0.0

    async def pad(self, modeled_s: float, real_s: float) -> bool:
        """Sleep until the scaled modeled time has passed; return True on an overrun."""
        target = modeled_s * self.time_scale
        st = self.stats
        st.n_steps += 1
        st.modeled_s += target
        if real_s > target:
            st.n_overruns += 1
            st.overrun_s += real_s - target
            await asyncio.sleep(0)  # let the loop breathe even when compute overran
            return True
        wait_s = target - real_s - self._late_s
        if wait_s <= 0:
            self._late_s = -wait_s
            await asyncio.sleep(0)
            return False
        before = time.monotonic()
        await asyncio.sleep(wait_s)
        slept = time.monotonic() - before
        self._late_s = max(0.0, slept - wait_s)
        st.slept_s += slept
        return False
