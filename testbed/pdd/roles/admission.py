"""The gateway's admission: a limit on open requests and a bounded queue in front of it.

At most ``limit`` requests are admitted (open) at once. One that arrives while
all are taken waits in a first-come-first-admitted queue of at most ``queue``
requests for at most ``wait_s`` seconds (each waiter's own limit is drawn
uniformly from [wait_s / 2, wait_s]: a crowd that arrived together, as a
benchmark's clients do when it starts, is then not refused together, and
the re-sends of those that were are spread too); a slot that frees passes straight to
the queue's head (nobody overtakes a waiter). A request beyond the queue, or
one whose wait ran out, is refused (``Overloaded``, which the gateway answers
429 with Retry-After). ``wait_s`` 0 or ``queue`` 0: no queue, the request
beyond the limit is refused at once.

Why a queue and not only refusals: a benchmark client (AIPerf) and many real
ones re-send a refused request at once, ignoring Retry-After, so a limit that
refuses at once turns every client beyond it into a loop of HTTP exchanges
as fast as the gateway answers (measured: ~660 refusals a second at
concurrency 1024, the gateway's event loop lagging up to 150 ms behind
them; with a fixed wait, the 512 waiters a concurrency-1024 run queues at its
start were all refused within a second, 10 s later, and re-sent at once,
and the loop lagged 369 ms behind that crowd). A waiting request costs a
future and a timer, no CPU; the queue's
bounds say how much it may hold and for how long (HAProxy's ``maxconn`` with
``timeout queue`` is the same design).

Pure asyncio, one event loop; tests/unit/test_admission.py.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque


class Overloaded(Exception):
    """Refused by the admission: the message says why (the gateway's 429 carries it)."""


class Admission:
    """See the module docstring. ``enter`` before the request is read, ``leave`` (exactly
    once per successful ``enter``) when it is over."""

    def __init__(self, limit: int, queue: int, wait_s: float,
                 rng: random.Random | None = None):
        if limit < 1 or queue < 0 or wait_s < 0:
            raise ValueError(f"admission needs limit >= 1, queue >= 0, wait_s >= 0; got "
                             f"{limit}, {queue}, {wait_s}")
        self.limit, self.queue, self.wait_s = limit, queue, wait_s
        self.open = 0  # admitted and not yet left
        self.queued = 0  # waiting now
        self._waiters: deque[asyncio.Future] = deque()  # may hold ended ones (skipped)
        self._rng = rng or random.Random()

    @property
    def queues(self) -> bool:
        return self.queue > 0 and self.wait_s > 0

    def _state(self) -> str:
        s = f"{self.open} requests open (client.max_open_requests {self.limit})"
        if self.queues:
            s += f", {self.queued} queued (client.max_queued_requests {self.queue})"
        return s

    async def enter(self) -> float:
        """Admit the caller at once or after a wait in the queue; return the seconds it
        waited. Raises ``Overloaded`` (the queue is full, or the wait ran out) or
        CancelledError (the caller was cancelled while waiting; nothing is held then)."""
        if self.open < self.limit and not self.queued:
            self.open += 1
            return 0.0
        if not self.queues or self.queued >= self.queue:
            raise Overloaded(self._state())
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiters.append(fut)
        self.queued += 1
        t0 = loop.time()
        timer = loop.call_later(self.wait_s * (0.5 + 0.5 * self._rng.random()),
                                self._expire, fut)
        try:
            admitted = await fut
        except asyncio.CancelledError:
            if fut.cancelled():  # still waiting: it leaves the queue
                self.queued -= 1
                self._trim()
            elif fut.result():  # admitted just as it was cancelled: the slot passes on
                self.leave()
            raise
        finally:
            timer.cancel()
        if not admitted:
            raise Overloaded(f"waited {loop.time() - t0:.2f} s in the admission queue "
                             f"(client.queue_timeout_s {self.wait_s:g}, each wait drawn from "
                             f"its half to it) for one of {self.limit} slots "
                             f"(client.max_open_requests)")
        return loop.time() - t0

    def _expire(self, fut: asyncio.Future) -> None:
        if not fut.done():
            fut.set_result(False)
            self.queued -= 1
            self._trim()

    def _trim(self) -> None:
        """Drop ended waiters from the head; rebuild when ended ones behind live ones
        (cancelled mid-queue) would let the deque outgrow the queue bound."""
        w = self._waiters
        while w and w[0].done():
            w.popleft()
        if len(w) > 2 * self.queue + 8:
            self._waiters = deque(f for f in w if not f.done())

    def leave(self) -> None:
        """An admitted request is over: its slot goes to the queue's head, else frees."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(True)
                self.queued -= 1
                return  # the slot passes on: open stays
        self.open -= 1
