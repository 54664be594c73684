"""Values in the notation Chaos Mesh accepts.

Owns the formatting of rates, durations and percentages for NetworkChaos,
PodChaos and Workflow fields, where the notation has traps (checked against
Chaos Mesh's source at commit 608b61e, the commit the CRD schemas in
``../shared/schemas/chaos-mesh/`` come from):

- ``rate`` (``bandwidth.rate``, ``rate.rate``) is passed to ``tc`` as is:
  ``bit``/``kbit``/``mbit``/``gbit`` are bits per second, ``bps``/``kbps``/...
  are BYTES per second. The admission webhook (``isValidRateUnit``) accepts
  only an unsigned integer before the unit: ``1.5gbit`` is rejected, so we
  write ``1500mbit``. Only the ``...bit`` units are ever written here.
- ``latency``/``jitter`` must match ``^[0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h)$``,
  and the daemon (``convertNetemToArgs``) compares them with ``"0ms"`` AS
  STRINGS: ``"0.5ms" > "0ms"`` is false, so a sub-millisecond value written
  with a leading ``0.`` is silently dropped. We write whole milliseconds
  (``20ms``) or whole microseconds (``500us``), never a leading ``0.``.
- Workflow ``deadline`` and StatusCheck ``duration`` are Go durations
  (``time.ParseDuration``): ``12.5s`` is fine there.
- ``loss`` and ``correlation`` are float strings (percent).
"""

from __future__ import annotations

RATE_UNITS = (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3), ("bit", 1))


def rate_string(rate_gbit: float) -> str:
    """A rate in bits per second as Chaos Mesh's webhook accepts it: ``rate_string(1.5)``
    -> ``"1500mbit"`` (an integer and the largest ``...bit`` unit that keeps it whole)."""
    bits = round(rate_gbit * 1e9)
    if bits < 1:
        raise ValueError(f"rate {rate_gbit!r} Gbit/s is below 1 bit/s")
    for unit, size in RATE_UNITS:
        if bits % size == 0:
            return f"{bits // size}{unit}"
    raise AssertionError("unreachable: 1 divides every integer")


def delay_string(delay_ms: float) -> str:
    """A netem latency/jitter: whole ms (``"20ms"``) or whole us (``"500us"``); never
    ``"0.5ms"``, which the daemon's string comparison with ``"0ms"`` would drop."""
    us = round(delay_ms * 1000)
    if us < 0:
        raise ValueError(f"negative delay {delay_ms!r} ms")
    return f"{us // 1000}ms" if us % 1000 == 0 else f"{us}us"


def seconds_string(seconds: float) -> str:
    """A Go duration in seconds, at most millisecond precision: ``12.5`` -> ``"12.5s"``."""
    ms = round(seconds * 1000)
    if ms < 1:
        raise ValueError(f"duration {seconds!r} s is below 1 ms")
    text = f"{ms // 1000}.{ms % 1000:03d}".rstrip("0").rstrip(".")
    return f"{text}s"


def pct_string(pct: float) -> str:
    """A percentage as a float string: ``10.0`` -> ``"10"``, ``0.25`` -> ``"0.25"``."""
    return f"{pct:.6f}".rstrip("0").rstrip(".")
