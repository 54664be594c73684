"""The router's model of the WAN: capacity, RTT and the KV backlog, as pure code.

Owns ``WanModel``: what the router believes about the path P -> MD, and its
prediction of when a request's KV will be complete at MD. No I/O and no
clock: every method takes the time ``now_s`` (the router passes
``testbed.clock.now()``), so tests drive it with made-up samples.

Inputs (all in nominal units: wire bytes x k):

- capacity: MD's WAN status, every ``main.wan_status_interval_s``, says how
  many KV bytes it received from P in the interval and whether a transfer
  was in progress for the whole interval (``busy``). A busy interval's rate
  is what the KV connection really got: the link's rate, or its share when
  cross traffic competes. The estimate is the bytes delivered in the busy
  intervals of the last ``window`` over their total length (a mean over
  busy time: idle time does not drag it down, and a dip is followed fully
  once the window has passed it), capped at the line rate ``line_gbit``
  (the configured WAN rate: MD reads in bursts between decode steps, so a
  single interval can show more than the line carries; measured: a
  windowed max read 19.5 Gbit/s on a 10 Gbit/s line):
  ``window = max(router.wan_window_min_s, router.wan_window_rtts x RTT)``.
  With no busy sample in the window the last estimate is held (the line
  rate before the first), with two corrections:

  * an interval that was not busy but still delivered bytes (a transfer
    that started or ended inside it) delivered at least its
    ``bytes / interval`` (the transfer ran for only part of it): above the
    held estimate, it raises it (capped at the line), as BBR uses an
    application-limited delivery-rate sample only when it exceeds its
    estimate. A short transfer after a dip thus shows the line is back.
  * ``recovered_gbit``: the held estimate returning toward the line rate,
    ``line - (line - held) x 2^(-age / recovery_half_life_s)`` (``age``:
    since the newest busy sample), is what ``predict(optimistic=True)``
    uses. The router takes it for one decision only, the late-KV rule
    (rld-only: do not send the KV at all), because that decision stops the
    measuring: measured in scenarios/loss.yaml (2026-12-02, commit
    72ba382), a window of stalled intervals during 10% loss set the
    estimate to 0, every later request's KV was then predicted to reach MD
    after RLD's last token and went rld-only, nothing crossed the WAN
    again, and the 0 stayed for the last 40 s of the run (RLD made 76% of
    the tokens). The p-md / relay decision keeps the held (pessimistic)
    estimate: relaying a request needlessly costs RLD a few tokens and its
    KV still crosses (and measures), while an optimistic p-md meets the
    dip with nothing to hide it (measured with the recovering estimate for
    every decision, the code of commit bec4b15, 2026-12-02, in
    fluctuation.yaml: two requests at t = 76.5-76.9 s, 7 s after the last
    busy sample, the line at 0.7 Gbit/s and the estimate back at 6.7
    Gbit/s, went p-md with TTFT 0.85 and 2.68 s; relayed in the run
    before: 0.18 and 0.26 s).
- RTT: the router's HEALTH probes to MD (``rtt_probe_interval_s``); the
  estimate is the minimum of the last ``rtt_window_s`` (queueing from our
  own bursts is filtered; a standing queue of cross traffic, or an ``rtt``
  fault, shows within the window).
- queue delay: the probes cross the same bottleneck queue as the KV (A ->
  B), and that queue is FIFO: the median of the last 3 probes minus the
  RTT is how long a byte sent now waits in it (``queue_delay_s``).
- backlog: every request routed with a WAN path is ``commit``-ted with its
  expected bytes (what MD's DRC lacks) and the time its transfer starts
  (P's expected prefill end); MD's status lists the bytes each transfer
  still misses (``progress``); ``done`` removes a transfer (KV at MD, or
  cancelled).

- overhead: what the path adds beyond bytes / capacity + 1.5 RTT (MD's
  DRC lookup and KV_NEED, P's and MD's framing, event-loop waits): each
  latency-bound transfer (nothing ahead of it at routing, and its bytes
  take less than one RTT at the capacity) gives ``actual - predicted``
  once both P's prefill end and MD's KV_DONE are known (``watch``, then
  ``prefill_ended`` and ``kv_done``; or ``add_residual`` directly); the
  overhead is the median of the last
  ``overhead_samples``, clamped to >= 0, added to every prediction. (A
  mean let one slow first transfer on a fresh connection, 1.4 s late,
  add 1.4 s to every prediction after it.)

- error: every watched transfer whose prediction was below ``margin_band_s``
  (the router passes 2 x its relay threshold: the transfers whose route a
  wrong prediction can flip) gives ``actual - predicted`` (overhead
  included); ``margin_s`` is the ``margin_quantile`` of the last
  ``margin_samples`` of them that are at most ``margin_window_s`` old (an
  error's time is its KV_DONE), clamped to >= 0. Scaled to the request
  being routed (``margin_s(now, wan_s)``): an error seen on a transfer
  predicted at most as long as this one counts whole (a queue, an
  outage or a stalled loop adds the same to any size), one seen on a
  longer transfer counts in proportion ``wan_s / predicted`` (TCP slow
  start on a fresh connection and a capacity estimate above the line's
  grow with the bytes). Unscaled, the first cold 1.2 GB transfers of
  quickstart.yaml, 0.3-0.4 s late (about what slow start costs a fresh
  connection: some 7 RTTs to open its 2 MB window), gave a 0.39 s margin
  to 0.07 s ones and relayed high-hit requests; on the project's CI
  machine, slower again, they relayed all 24 and left none to pair
  (2026-12-03, before commit ec204b8). The router decides
  "short enough for p-md" on ``wan_s + margin_s``, a pessimistic
  prediction: a request routed p-md that waits longer than predicted
  (behind an in-flight prefix, a prefill backlog, or a capacity estimate
  that lags a dip) waits on the WAN with nothing to hide it, while one
  relayed needlessly only costs RLD a few tokens. (Measured before the
  margin: near-threshold p-md requests predicted 0.10, 0.45 and 0.47 s
  took 0.65, 0.56 and 1.77 s and set the TTFT tail.) The window makes the
  margin a property of the WAN's recent past, not of the whole run:
  without it, the errors of a congested spell kept the margin near 1.8 s
  for some 30 requests after the cross traffic stopped (each new sample
  replaces one of the last 30), so the router relayed 0.1 s transfers and
  RLD decoded their tokens (scenarios/congestion.yaml, 2026-12-02, before
  commit 6fa841c).

Prediction (``predict``): P interleaves the KV chunks of concurrent
transfers on its one connection to MD, one chunk each in turn, so
transfers share the capacity in a round robin whose quantum is one KV
chunk (``quantum_bytes``: ``prefill.kv_chunk_tokens`` tokens of KV). A
simulation of that round robin over the committed transfers plus the new
one, each joining at its start time, gives the time the new one's last
byte leaves (``rr_finish_s``; with quantum 0 the fluid processor-sharing
limit, ``ps_finish_s``). The quantum matters for short transfers: a
16-token suffix behind five transfers waits for five 64-token chunks, not
for five times its own size (measured in scenarios/pdd-vs-baseline.yaml
with the fluid model: transfers predicted at 0.17-0.35 s behind 5-7 others
took 0.71-1.03 s); plus the queue delay, plus 1.5 RTT (P's REQUEST to MD,
MD's KV_NEED back, the last chunk's propagation). With nothing queued this
is ``bytes / capacity + 1.5 RTT + overhead``; a backlog ahead of a
transfer of S bytes adds about ``sum(min(b_i, max(S, quantum)))``.

Example::

    wan = WanModel(line_gbit=10.0, prior_rtt_s=0.04)
    wan.add_rate_sample(now_s=1.0, nominal_bytes=125_000_000, interval_s=0.1, busy=True)
    wan.commit(7, nominal_bytes=2e9, start_s=1.0)
    wan.predict(now_s=1.0, nominal_bytes=5e8, start_s=1.2).wan_s
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

MIN_GBIT = 1e-3  # floor of the rate used in predictions (an outage measures 0)

@dataclass(frozen=True)
class WanPrediction:
    """One prediction and what it was made from (kept in the decision record)."""

    wan_s: float  # transfer start -> KV complete at MD
    start_s: float  # when the transfer starts (P's expected prefill end), router clock
    backlog_bytes: float  # nominal bytes committed and not yet delivered, ahead of it
    backlog_transfers: int
    capacity_gbit: float
    rtt_s: float
    overhead_s: float = 0.0
    queue_delay_s: float = 0.0
    capacity_age_s: float = 0.0  # since the newest busy sample (0: measured in the window)

    @property
    def arrival_s(self) -> float:
        """Router clock time at which MD is expected to hold the KV."""
        return self.start_s + self.wan_s


@dataclass
class _Transfer:
    remaining: float  # nominal bytes
    start_s: float


class WanModel:
    """See the module docstring."""

    def __init__(self, line_gbit: float, prior_rtt_s: float, *, window_min_s: float = 0.5,
                 window_rtts: float = 5.0, rtt_window_s: float = 2.0,
                 overhead_samples: int = 15, margin_band_s: float = 1.0,
                 margin_quantile: float = 0.9, margin_samples: int = 30,
                 margin_window_s: float = 10.0, quantum_bytes: float = 0.0,
                 recovery_half_life_s: float = 5.0):
        if line_gbit <= 0 or prior_rtt_s < 0:
            raise ValueError(f"line rate must be > 0 and RTT >= 0, got {line_gbit}, "
                             f"{prior_rtt_s}")
        if recovery_half_life_s <= 0:
            raise ValueError(f"recovery half-life must be > 0, got {recovery_half_life_s}")
        self.recovery_half_life_s = recovery_half_life_s
        self.line_gbit = line_gbit
        self.quantum_bytes = quantum_bytes  # nominal bytes of one KV chunk (0: fluid)
        self.window_min_s, self.window_rtts = window_min_s, window_rtts
        self.rtt_window_s = rtt_window_s
        self.overhead_s = 0.0
        self._residuals: deque[float] = deque(maxlen=overhead_samples)
        self.n_residuals = 0
        if not 0.0 <= margin_quantile <= 1.0:
            raise ValueError(f"margin quantile must be in [0, 1], got {margin_quantile}")
        self.margin_band_s, self.margin_quantile = margin_band_s, margin_quantile
        self.margin_window_s = margin_window_s
        # (t, error, predicted wan_s)
        self._errors: deque[tuple[float, float, float]] = deque(maxlen=margin_samples)
        self.n_errors = 0
        self._gbit = line_gbit  # the held estimate: the last busy window's, or a lower bound
        self._last_busy_s: float | None = None  # time of the newest busy sample
        self._rtt = prior_rtt_s
        self._rates: deque[tuple[float, float, float]] = deque()  # busy (t, bytes, s)
        self._rtts: deque[tuple[float, float]] = deque()  # (t, rtt_s)
        self._transfers: dict[int, _Transfer] = {}
        # watched transfers: rid -> [prediction, teaches the overhead, prefill end, KV_DONE]
        self._watched: dict[int, list] = {}
        self.n_rate_samples = 0
        self.n_rtt_samples = 0

    # -- inputs ----------------------------------------------------------------
    def add_rate_sample(self, now_s: float, nominal_bytes: float, interval_s: float,
                        busy: bool) -> bool:
        """MD received ``nominal_bytes`` in the ``interval_s`` ending at ``now_s``.

        Busy intervals (a transfer in progress throughout) are rate samples;
        a not-busy one can only raise a held estimate (a lower bound, module
        docstring). Returns whether this one was used.
        """
        if interval_s <= 0:
            return False
        if not busy:
            return self._lower_bound(now_s, nominal_bytes * 8 / interval_s / 1e9)
        self._rates.append((now_s, float(nominal_bytes), interval_s))
        self._last_busy_s = now_s if self._last_busy_s is None else max(self._last_busy_s, now_s)
        self.n_rate_samples += 1
        self.capacity_gbit(now_s)
        return True

    def add_rtt_sample(self, now_s: float, rtt_s: float) -> None:
        if rtt_s < 0:
            raise ValueError(f"negative RTT sample {rtt_s}")
        self._rtts.append((now_s, rtt_s))
        self.n_rtt_samples += 1
        self.rtt_s(now_s)

    def add_residual(self, residual_s: float) -> None:
        """actual - predicted WAN time of a latency-bound transfer."""
        self._residuals.append(residual_s)
        self.n_residuals += 1
        self.overhead_s = max(0.0, statistics.median(self._residuals))

    def watch(self, rid: int, now_s: float, nominal_bytes: float, pred: WanPrediction) -> bool:
        """Follow transfer ``rid`` (``pred`` is its prediction) until ``prefill_ended`` and
        ``kv_done`` give its actual WAN time; returns whether it will also teach the
        overhead (latency-bound, nothing ahead)."""
        latency = not pred.backlog_transfers and self.latency_bound(now_s, nominal_bytes)
        self._watched[rid] = [pred, latency, None, None]
        return latency

    def prefill_ended(self, rid: int, t_s: float) -> None:
        """P's prefill end of transfer ``rid`` (the start of its WAN time)."""
        self._watched_part(rid, 2, t_s)

    def kv_done(self, rid: int, t_s: float) -> None:
        """MD had all of transfer ``rid``'s KV at ``t_s``."""
        self._watched_part(rid, 3, t_s)

    def _watched_part(self, rid: int, index: int, t_s: float) -> None:
        parts = self._watched.get(rid)
        if parts is None:
            return
        parts[index] = t_s
        pred, latency, start, end = parts
        if start is None or end is None:
            return
        del self._watched[rid]
        actual = end - start
        if latency:
            self.add_residual(actual - (pred.wan_s - pred.overhead_s))
        if pred.wan_s < self.margin_band_s:
            self.add_error(actual - pred.wan_s, end, pred.wan_s)

    def add_error(self, error_s: float, t_s: float = 0.0,
                  predicted_s: float | None = None) -> None:
        """actual - predicted WAN time (overhead included) of a near-threshold transfer whose
        KV was complete at MD at ``t_s``; ``predicted_s``: its predicted WAN time (None:
        unknown, the error counts whole for any request)."""
        self._errors.append((t_s, error_s, 0.0 if predicted_s is None else predicted_s))
        self.n_errors += 1

    def margin_s(self, now_s: float | None = None, wan_s: float | None = None) -> float:
        """The ``margin_quantile`` of the errors of the last ``margin_window_s`` before
        ``now_s`` (None: every kept error), >= 0: what a pessimistic prediction adds; 0
        without such an error or with quantile 0. With ``wan_s`` (the prediction of the
        request being routed), an error seen on a transfer predicted longer than ``wan_s``
        counts ``wan_s / predicted`` of itself (the module docstring)."""
        recent = [e if wan_s is None or p <= wan_s else e * (wan_s / p)
                  for t, e, p in self._errors
                  if now_s is None or t >= now_s - self.margin_window_s]
        if not recent or self.margin_quantile == 0:
            return 0.0
        errors = sorted(recent)
        index = min(len(errors) - 1, int(self.margin_quantile * len(errors)))
        return max(0.0, errors[index])

    def forget(self, rid: int) -> None:
        """Request ``rid`` is gone: out of the backlog and no longer watched."""
        self.done(rid)
        self._watched.pop(rid, None)

    def latency_bound(self, now_s: float, nominal_bytes: float) -> bool:
        """Whether ``nominal_bytes`` take less than one RTT at the capacity."""
        rate = max(self.capacity_gbit(now_s), MIN_GBIT) * 1e9 / 8
        return nominal_bytes / rate < self.rtt_s(now_s)

    def commit(self, rid: int, nominal_bytes: float, start_s: float) -> None:
        """A transfer of ``nominal_bytes`` will start at ``start_s``."""
        if nominal_bytes > 0:
            self._transfers[rid] = _Transfer(float(nominal_bytes), start_s)

    def progress(self, rid: int, remaining_bytes: float, now_s: float) -> None:
        """MD says transfer ``rid`` is under way and still misses ``remaining_bytes``."""
        t = self._transfers.get(rid)
        if t is not None:
            t.remaining = max(0.0, float(remaining_bytes))
            t.start_s = min(t.start_s, now_s)

    def done(self, rid: int) -> None:
        self._transfers.pop(rid, None)

    # -- estimates -------------------------------------------------------------
    def window_s(self) -> float:
        return max(self.window_min_s, self.window_rtts * self._rtt)

    def _lower_bound(self, now_s: float, gbit: float) -> bool:
        """A not-busy interval delivered at least ``gbit``: raise a held estimate below it."""
        self._expire(now_s)
        if self._rates or gbit <= self._gbit:
            return False
        self._gbit = min(self.line_gbit, gbit)
        return True

    def capacity_gbit(self, now_s: float) -> float:
        """Busy-time mean over the window, capped at the line rate; held when none is recent
        (and raised by a faster not-busy interval)."""
        self._expire(now_s)
        if self._rates:
            busy_s = sum(s for _, _, s in self._rates)
            gbit = sum(b for _, b, _ in self._rates) * 8 / busy_s / 1e9
            self._gbit = min(self.line_gbit, gbit)
        return self._gbit

    def recovered_gbit(self, now_s: float) -> float:
        """The estimate returning toward the line rate while nothing measures it (module
        docstring): equal to ``capacity_gbit`` while the window holds a busy sample."""
        gbit = self.capacity_gbit(now_s)
        age = self.capacity_age_s(now_s)
        return self.line_gbit - (self.line_gbit - gbit) * 0.5 ** (age / self.recovery_half_life_s)

    def capacity_age_s(self, now_s: float) -> float:
        """0 while the window holds a busy sample; else the time since the newest one (0
        before the first: the prior is the line rate itself)."""
        self._expire(now_s)
        if self._rates or self._last_busy_s is None:
            return 0.0
        return max(0.0, now_s - self._last_busy_s)

    def rtt_s(self, now_s: float) -> float:
        """Windowed min of the RTT probes; the last estimate when none is recent."""
        self._expire(now_s)
        if self._rtts:
            self._rtt = min(r for _, r in self._rtts)
        return self._rtt

    def queue_delay_s(self, now_s: float) -> float:
        """Median of the last 3 RTT probes minus the RTT estimate (>= 0)."""
        recent = [r for _, r in list(self._rtts)[-3:]]
        return max(0.0, statistics.median(recent) - self.rtt_s(now_s)) if recent else 0.0

    def backlog_bytes(self) -> float:
        return sum(t.remaining for t in self._transfers.values())

    @property
    def n_transfers(self) -> int:
        return len(self._transfers)

    def _expire(self, now_s: float) -> None:
        horizon = now_s - self.window_s()
        while self._rates and self._rates[0][0] < horizon:
            self._rates.popleft()
        while self._rtts and self._rtts[0][0] < now_s - self.rtt_window_s:
            self._rtts.popleft()

    # -- prediction ------------------------------------------------------------
    def predict(self, now_s: float, nominal_bytes: float, start_s: float,
                optimistic: bool = False) -> WanPrediction:
        """When would a transfer of ``nominal_bytes`` starting at ``start_s`` be at MD?
        ``optimistic``: at ``recovered_gbit``, not the held estimate (module docstring)."""
        gbit = self.recovered_gbit(now_s) if optimistic else self.capacity_gbit(now_s)
        rtt = self.rtt_s(now_s)
        rate = max(gbit, MIN_GBIT) * 1e9 / 8  # bytes/s; a link that is down: very slow
        others = [(max(now_s, t.start_s), t.remaining) for t in self._transfers.values()
                  if t.remaining > 0]
        finish = rr_finish_s(others, (max(now_s, start_s), float(nominal_bytes)), rate, now_s,
                             self.quantum_bytes)
        queue_s = self.queue_delay_s(now_s)
        wan_s = finish - max(now_s, start_s) + queue_s + 1.5 * rtt + self.overhead_s
        return WanPrediction(wan_s, start_s, sum(b for _, b in others), len(others), gbit, rtt,
                             self.overhead_s, queue_s, self.capacity_age_s(now_s))


def ps_finish_s(others: list[tuple[float, float]], mine: tuple[float, float], rate: float,
                now_s: float) -> float:
    """Fluid processor sharing: when does ``mine`` = (start_s, bytes) finish?

    ``others`` are (start_s, bytes) of the other transfers; all jobs active
    at a time share ``rate`` (bytes/s) equally. Example: one other job of
    the same size started together -> twice the time alone:
    ``ps_finish_s([(0, 10)], (0, 10), 1.0, 0) == 20.0``.
    """
    jobs = [[s, b] for s, b in others if b > 0] + [[mine[0], mine[1]]]
    me = jobs[-1]
    if me[1] <= 0:
        return max(now_s, me[0])
    t = now_s
    # Each step ends at the next start or drains the smallest active job to exactly 0
    # (no rounding residue can keep a job alive), so it takes at most one step per job
    # and per start.
    for _ in range(3 * len(jobs) + 4):
        active = [j for j in jobs if j[0] <= t and j[1] > 0]
        pending = [j[0] for j in jobs if j[0] > t and j[1] > 0]
        if not active:
            t = min(pending)
            continue
        share = rate / len(active)
        smallest = min(active, key=lambda j: j[1])
        dt_done = smallest[1] / share
        if pending and min(pending) - t <= dt_done:
            sent = share * (min(pending) - t)
            for j in active:
                j[1] = max(0.0, j[1] - sent)
            t = min(pending)
        else:
            sent = smallest[1]
            for j in active:
                j[1] = 0.0 if j is smallest else max(0.0, j[1] - sent)
            t += dt_done
        if me[1] <= 0:
            return t
    raise AssertionError("ps_finish_s: more steps than jobs and starts")


RR_MAX_STEPS = 100_000  # beyond this many chunks the fluid limit stands in (same rates)


def rr_finish_s(others: list[tuple[float, float]], mine: tuple[float, float], rate: float,
                now_s: float, quantum: float) -> float:
    """Round robin with a quantum: when does ``mine`` = (start_s, bytes) finish?

    The active jobs send ``quantum`` bytes each in turn at ``rate`` (bytes/s), a
    job joining the turn at the back once its start has come, and going to the
    back after each quantum. ``quantum <= 0`` is the fluid limit
    (``ps_finish_s``). Example: a 1-byte job behind two 10-byte jobs, quantum 4:
    ``rr_finish_s([(0, 10), (0, 10)], (0, 1), 1.0, 0, 4) == 9.0`` (4 + 4 + 1).
    """
    if quantum <= 0 or mine[1] <= 0:
        return ps_finish_s(others, mine, rate, now_s)
    jobs = sorted(([s, b] for s, b in others if b > 0), key=lambda j: j[0])
    me = [mine[0], mine[1]]
    jobs.insert(next((i for i, j in enumerate(jobs) if j[0] > me[0]), len(jobs)), me)
    pending, turn, t = deque(jobs), deque(), now_s
    for _ in range(RR_MAX_STEPS):
        while pending and pending[0][0] <= t:
            turn.append(pending.popleft())
        if not turn:
            t = pending[0][0]
            continue
        job = turn.popleft()
        sent = min(quantum, job[1])
        t += sent / rate
        job[1] -= sent
        if job is me and me[1] <= 0:
            return t
        while pending and pending[0][0] <= t:
            turn.append(pending.popleft())
        if job[1] > 0:
            turn.append(job)
    return ps_finish_s(others, mine, rate, now_s)
