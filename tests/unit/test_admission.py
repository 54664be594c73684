"""testbed.pdd.roles.admission: the limit, the queue's order and bounds, timeouts and
cancellations never leaking or overfilling a slot."""

from __future__ import annotations

import asyncio
import random

import pytest

from testbed.pdd.roles.admission import Admission, Overloaded


def run(coro):
    return asyncio.run(coro)


def test_admits_up_to_the_limit_then_refuses_at_once_without_a_queue():
    async def main():
        adm = Admission(2, 0, 5.0)
        assert await adm.enter() == 0.0 and await adm.enter() == 0.0
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(Overloaded, match=r"^2 requests open \(client.max_open_requests 2\)$"):
            await adm.enter()
        assert loop.time() - t0 < 0.5
        adm.leave()
        assert adm.open == 1
        assert await adm.enter() == 0.0
        assert adm.open == 2
    run(main())


def test_zero_wait_means_no_queue():
    async def main():
        adm = Admission(1, 10, 0.0)
        await adm.enter()
        with pytest.raises(Overloaded):
            await adm.enter()
        assert adm.queued == 0
    run(main())


def test_waiters_are_admitted_first_come_first_admitted():
    async def main():
        adm = Admission(1, 3, 10.0)
        await adm.enter()
        order = []

        async def waiter(i):
            waited = await adm.enter()
            order.append((i, waited > 0))

        tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
        await asyncio.sleep(0.01)
        assert adm.queued == 3 and adm.open == 1
        for expect in range(3):
            adm.leave()  # the slot passes to the head: open stays 1
            await asyncio.sleep(0.01)
            assert adm.open == 1 and order[-1] == (expect, True)
        await asyncio.gather(*tasks)
        adm.leave()
        assert (adm.open, adm.queued) == (0, 0)
    run(main())


def test_a_newcomer_does_not_overtake_a_waiter():
    async def main():
        adm = Admission(1, 2, 10.0)
        await adm.enter()
        first = asyncio.create_task(adm.enter())
        await asyncio.sleep(0.01)
        adm.leave()  # handed to `first` even though a newcomer is about to ask
        late = asyncio.create_task(adm.enter())
        await asyncio.sleep(0.01)
        assert first.done() and not late.done() and adm.queued == 1
        adm.leave()
        await late
        adm.leave()
        assert adm.open == 0
    run(main())


def test_a_full_queue_refuses_at_once_and_says_so():
    async def main():
        adm = Admission(1, 2, 10.0)
        await adm.enter()
        tasks = [asyncio.create_task(adm.enter()) for _ in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded, match=r"1 requests open .*, 2 queued "
                                             r"\(client.max_queued_requests 2\)"):
            await adm.enter()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert adm.queued == 0 and adm.open == 1
    run(main())


def test_a_wait_that_runs_out_is_refused_and_holds_nothing():
    async def main():
        adm = Admission(1, 4, 0.1)
        await adm.enter()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(Overloaded, match=r"waited 0\.\d\d s in the admission queue "
                                             r"\(client.queue_timeout_s 0.1,"):
            await adm.enter()
        assert loop.time() - t0 >= 0.05
        assert adm.queued == 0 and adm.open == 1
        adm.leave()  # nobody live is waiting: the slot frees
        assert adm.open == 0 and not adm._waiters
    run(main())


def test_cancelled_while_waiting_leaves_the_queue():
    async def main():
        adm = Admission(1, 4, 10.0)
        await adm.enter()
        a = asyncio.create_task(adm.enter())
        b = asyncio.create_task(adm.enter())
        await asyncio.sleep(0.01)
        a.cancel()
        await asyncio.gather(a, return_exceptions=True)
        assert adm.queued == 1
        adm.leave()  # skips the cancelled one, goes to b
        assert await b > 0 and adm.open == 1 and adm.queued == 0
        adm.leave()
        assert adm.open == 0
    run(main())


def test_cancelled_just_as_admitted_passes_the_slot_on():
    async def main():
        adm = Admission(1, 4, 10.0)
        await adm.enter()
        a = asyncio.create_task(adm.enter())
        b = asyncio.create_task(adm.enter())
        await asyncio.sleep(0.01)
        adm.leave()  # a is granted the slot ...
        a.cancel()  # ... and cancelled before it runs again
        await asyncio.gather(a, return_exceptions=True)
        assert a.cancelled()
        assert await b > 0  # the slot went on to b
        assert adm.open == 1 and adm.queued == 0
        adm.leave()
        assert adm.open == 0
    run(main())


@pytest.mark.parametrize("seed", range(5))
def test_random_load_never_overfills_and_leaks_nothing(seed):
    """Hundreds of requests with random holds, random cancellations and short waits:
    at no moment more than ``limit`` open or ``queue`` queued; at the end nothing is held
    and every request was admitted, refused or cancelled."""
    rng = random.Random(seed)
    limit, queue = 5, 7

    async def main():
        adm = Admission(limit, queue, 0.03)
        inside = 0
        peak = 0
        outcome = {"admitted": 0, "refused": 0, "cancelled": 0}

        async def request():
            nonlocal inside, peak
            try:
                await adm.enter()
            except Overloaded:
                outcome["refused"] += 1
                return
            inside += 1
            peak = max(peak, inside)
            assert adm.open <= limit and adm.queued <= queue
            try:
                await asyncio.sleep(rng.uniform(0, 0.02))
            finally:
                inside -= 1
                adm.leave()
            outcome["admitted"] += 1

        tasks = []
        for _ in range(400):
            tasks.append(asyncio.create_task(request()))
            if rng.random() < 0.2:
                victim = rng.choice(tasks)
                victim.cancel()
            await asyncio.sleep(rng.uniform(0, 0.002))
            assert adm.open <= limit and adm.queued <= queue
        results = await asyncio.gather(*tasks, return_exceptions=True)
        outcome["cancelled"] = sum(isinstance(r, asyncio.CancelledError) for r in results)
        assert sum(outcome.values()) == 400
        assert (adm.open, adm.queued, inside) == (0, 0, 0)
        assert peak <= limit and outcome["admitted"] > 0 and outcome["refused"] > 0
        assert len(adm._waiters) == 0 or all(f.done() for f in adm._waiters)
    run(main())


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="limit >= 1"):
        Admission(0, 1, 1.0)


def test_waits_are_drawn_between_half_the_timeout_and_it_so_a_crowd_is_not_refused_at_once():
    async def main():
        adm = Admission(1, 200, 0.4, rng=random.Random(7))
        await adm.enter()
        loop = asyncio.get_running_loop()
        drawn = []
        real = loop.call_later

        def call_later(delay, cb, *args):  # the wait each waiter was given
            drawn.append(delay)
            return real(delay, cb, *args)

        loop.call_later = call_later
        results = await asyncio.gather(*(adm.enter() for _ in range(200)),
                                       return_exceptions=True)
        assert all(isinstance(r, Overloaded) for r in results)  # the slot stayed held
        assert len(drawn) == 200 and all(0.2 <= d <= 0.4 for d in drawn)
        # spread over the interval, not bunched: each fifth of it holds 10-30 % of them
        fifths = [sum(0.2 + 0.04 * k <= d < 0.2 + 0.04 * (k + 1) for d in drawn)
                  for k in range(5)]
        assert all(20 <= n <= 60 for n in fifths), fifths
        assert adm.queued == 0 and adm.open == 1
    run(main())
