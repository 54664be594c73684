"""The one pacer (AsyncPacer) against an injected fake time: padding, overruns, late wake-ups."""

from __future__ import annotations

import asyncio

import pytest

from testbed.pdd.compute.pacing import AsyncPacer


class FakeTime:
    """Injectable clock: compute advances it by hand, sleep advances it by the wait (+ lateness)."""

    def __init__(self, late_s: float = 0.0):
        self.now, self.late_s, self.sleeps = 100.0, late_s, []

    def clock(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        if s > 0:
            self.now += s + self.late_s


def pacer_with(t: FakeTime, time_scale: float = 1.0) -> AsyncPacer:
    return AsyncPacer(time_scale, clock=t.clock, sleep=t.sleep)


def test_pacer_pads_to_modeled_time_scaled():
    t = FakeTime()
    pacer = pacer_with(t, time_scale=0.5)
    assert asyncio.run(pacer.pad(0.060, 0.010)) is False  # 30 ms modeled at scale 0.5
    assert t.sleeps == [pytest.approx(0.020)]
    assert t.now == pytest.approx(100.020)
    s = pacer.stats
    assert (s.n_steps, s.n_overruns, s.overrun_s) == (1, 0, 0.0)
    assert s.modeled_s == pytest.approx(0.030) and s.slept_s == pytest.approx(0.020)


@pytest.mark.parametrize("modeled, real, overrun, overrun_s, slept", [
    (0.030, 0.010, False, 0.0, 0.020),
    (0.010, 0.010, False, 0.0, 0.0),
    (0.010, 0.025, True, 0.015, 0.0),
    (0.0, 0.005, True, 0.005, 0.0),
])
def test_pacer_overrun_table(modeled, real, overrun, overrun_s, slept):
    t = FakeTime()
    pacer = pacer_with(t)
    assert asyncio.run(pacer.pad(modeled, real)) is overrun
    assert pacer.stats.n_overruns == int(overrun)
    assert pacer.stats.overrun_s == pytest.approx(overrun_s)
    assert pacer.stats.slept_s == pytest.approx(slept)
    assert t.sleeps == [pytest.approx(slept)]  # an overrun still yields to the loop (sleep 0)


def test_pacer_accumulates_overruns_and_absorbs_late_wakeups():
    t = FakeTime(late_s=0.001)  # the OS wakes us 1 ms late every time
    pacer = pacer_with(t)
    start = t.now

    async def steps():
        for _ in range(10):
            t.now += 0.002  # real compute
            await pacer.pad(0.010, 0.002)
        for real in (0.020, 0.030):
            await pacer.pad(0.010, real)
    asyncio.run(steps())
    # Each late wake-up is taken off the next wait: the timeline drifts by one
    # wake-up (1 ms), not by ten.
    assert t.now - start == pytest.approx(0.100 + 0.001)
    assert pacer.stats.n_overruns == 2 and pacer.stats.overrun_s == pytest.approx(0.030)


def test_time_scale_must_be_positive():
    with pytest.raises(ValueError, match="time_scale"):
        AsyncPacer(0.0)
