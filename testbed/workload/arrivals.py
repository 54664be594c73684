"""Request arrival processes: Poisson, bursty (on/off) and fixed interval.

Owns ArrivalProcess, ArrivalSpec, ``parse_arrival`` and ``arrival_times``.
The first request always arrives at t = 0; times are seconds from the
workload start and never decrease.

- poisson: exponential gaps with mean 1/rate_rps (CV = 1).
- bursty: bursts of ``burst_size`` requests; inside a burst the gaps are
  exponential with mean 1/rate_rps; before every burst but the first comes an
  extra idle gap, exponential with mean ``burst_gap_s``. Long-run rate:
  burst_size / (burst_size / rate_rps + burst_gap_s); the gaps' CV exceeds 1
  whenever burst_gap_s is large against 1/rate_rps.
- fixed: one request every ``interval_s`` (CV = 0).

Example::

    spec = ArrivalSpec(ArrivalProcess.POISSON, rate_rps=2.0)
    arrival_times(spec, np.random.default_rng(0), n=100)        # 100 times, first 0.0
    arrival_times(spec, np.random.default_rng(0), duration_s=60) # every time <= 60 s
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from testbed.reader import Fields

MAX_RATE_RPS = 1e6
MAX_BURST_SIZE = 100_000
MAX_GAP_S = 86_400.0
_CHUNK = 4096  # gaps drawn per step when generating up to a duration


class ArrivalProcess(enum.Enum):
    POISSON = "poisson"
    BURSTY = "bursty"
    FIXED = "fixed"


@dataclass(frozen=True)
class ArrivalSpec:
    process: ArrivalProcess
    rate_rps: float = 0.0  # poisson: mean rate; bursty: rate inside a burst
    burst_size: int = 1  # bursty: requests per burst
    burst_gap_s: float = 0.0  # bursty: mean idle time between bursts
    interval_s: float = 0.0  # fixed: time between requests

    @property
    def mean_rate_rps(self) -> float:
        """Long-run requests per second."""
        if self.process is ArrivalProcess.FIXED:
            return 1.0 / self.interval_s
        if self.process is ArrivalProcess.POISSON:
            return self.rate_rps
        return self.burst_size / (self.burst_size / self.rate_rps + self.burst_gap_s)


def parse_arrival(f: Fields) -> ArrivalSpec:
    """Parse ``{process: poisson, rate_rps: 2}`` and its bursty/fixed siblings."""
    process = ArrivalProcess(f.choice("process", tuple(p.value for p in ArrivalProcess)))
    if process is ArrivalProcess.FIXED:
        spec = ArrivalSpec(process, interval_s=f.num("interval_s", lo=0, lo_open=True,
                                                     hi=MAX_GAP_S, unit="s"))
    else:
        rate = f.num("rate_rps", lo=0, lo_open=True, hi=MAX_RATE_RPS, unit="requests/s")
        if process is ArrivalProcess.POISSON:
            spec = ArrivalSpec(process, rate_rps=rate)
        else:
            spec = ArrivalSpec(process, rate_rps=rate,
                               burst_size=f.int("burst_size", lo=1, hi=MAX_BURST_SIZE),
                               burst_gap_s=f.num("burst_gap_s", lo=0, lo_open=True,
                                                 hi=MAX_GAP_S, unit="s"))
    f.done()
    return spec


def _gaps(spec: ArrivalSpec, rng: np.random.Generator, first_index: int, n: int) -> np.ndarray:
    """Gaps before requests first_index .. first_index+n-1 (request 0's gap is 0)."""
    if spec.process is ArrivalProcess.FIXED:
        gaps = np.full(n, spec.interval_s)
    else:
        gaps = rng.exponential(1.0 / spec.rate_rps, size=n)
        if spec.process is ArrivalProcess.BURSTY:
            index = np.arange(first_index, first_index + n)
            starts = index % spec.burst_size == 0
            gaps[starts] += rng.exponential(spec.burst_gap_s, size=int(starts.sum()))
    if first_index == 0 and n:
        gaps[0] = 0.0
    return gaps


def arrival_times(spec: ArrivalSpec, rng: np.random.Generator, *, n: int | None = None,
                  duration_s: float | None = None) -> np.ndarray:
    """Arrival times in seconds: exactly ``n`` of them, or all up to ``duration_s``."""
    if (n is None) == (duration_s is None):
        raise ValueError("give exactly one of n and duration_s")
    if n is not None:
        return np.cumsum(_gaps(spec, rng, 0, n))
    chunks, last, done = [], 0.0, 0
    while True:
        times = last + np.cumsum(_gaps(spec, rng, done, _CHUNK))
        keep = times[times <= duration_s]
        chunks.append(keep)
        if len(keep) < _CHUNK:
            return np.concatenate(chunks)
        last, done = float(times[-1]), done + _CHUNK
