"""Pure arithmetic of link shaping: scale, htb rate/burst, queue limits.

Owns the numbers that turn a nominal LinkSpec into emulated parameters: the
bandwidth scale k (docs/design.md, "Bandwidth scale k": emulate rate/k,
divide payloads by k, keep delays real), htb rate/burst/RATE64, queue limits
sized from the bandwidth-delay product, and the capacities of each backend
measured on the project's reference machine (2 cores, see DEVELOPERS notes).
No I/O.

Known distortion of k: the BDP in packets shrinks by k, so TCP slow start
reaches the link rate k times sooner in packets; transfer times of large
payloads are preserved, the first few RTTs of a flow are not.

Example::

    k = choose_scale(topo, Backend.USERSPACE)        # 10 for a 10 Gbit/s WAN
    htb = htb_params(10.0, k)                        # rate 1 Gbit/s emulated
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from testbed.linkmath import GSO_MAX_BYTES, MTU_BYTES, bdp_bytes

U32_MAX = (1 << 32) - 1


class Backend(enum.Enum):
    NETEM = "netem"
    USERSPACE = "userspace"


# Highest emulated WAN rate each backend delivers accurately on the
# reference machine (2 cores). userspace: the Python delay line keeps ~1 ms
# accuracy only unsaturated (below ~1-2 Gbit/s); netem: htb/tbf are accurate
# to 5 Gbit/s and within 1-7% at 10 Gbit/s.
WAN_CAPACITY_GBIT = {Backend.USERSPACE: 1.0, Backend.NETEM: 5.0}
# Highest rate an intra-DC link is emulated at. htb is accurate to 5 Gbit/s
# and within 1-7% at 10 here, but a 10 Gbit/s veth flow needs a whole core:
# under the load of a PDD run it fell to 7.5 Gbit/s, so stay at 4.
HTB_CEILING_GBIT = 4.0
# Scales tried in order by choose_scale; "nice" numbers keep reports readable.
NICE_SCALES = (1, 2, 2.5, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64, 80, 100,
               125, 160, 200, 250, 400, 500, 1000)


def choose_scale(wan_gbit: float, intra_gbit: float, backend: Backend) -> float:
    """Smallest nice k with wan/k within the backend's capacity and every
    intra-DC link within the htb ceiling."""
    need = max(wan_gbit / WAN_CAPACITY_GBIT[backend], intra_gbit / HTB_CEILING_GBIT, 1.0)
    for k in NICE_SCALES:
        if k >= need - 1e-9:
            return float(k)
    return float(math.ceil(need))


@dataclass(frozen=True)
class HtbParams:
    """htb class parameters for one direction (bytes, bytes per second)."""

    nominal_gbit: float
    rate_bps: int          # emulated, bits per second
    burst_bytes: int
    rate64: bool           # rate in bytes/s does not fit htb's u32 field

    @property
    def emulated_gbit(self) -> float:
        return self.rate_bps / 1e9


def htb_params(nominal_gbit: float, scale: float) -> HtbParams:
    """htb rate = nominal/k; burst >= 1 ms of data and >= 2 GSO frames.

    tbf/htb need ~1 MB of burst at 10 Gbit/s here; a burst below one GSO
    frame (64 KB) stalls the class.
    """
    rate_bps = int(round(nominal_gbit * 1e9 / scale))
    burst = max(math.ceil(rate_bps / 8 * 1e-3), 2 * GSO_MAX_BYTES)
    return HtbParams(nominal_gbit, rate_bps, burst, rate_bps // 8 > U32_MAX)


def queue_limit_pkts(rate_bps: int, rtt_ms: float, given: int | None) -> int:
    """Bottleneck queue: the spec's limit, else one BDP (at least 64 packets)."""
    if given is not None:
        return given
    return max(64, math.ceil(int(bdp_bytes(rate_bps, rtt_ms)) / MTU_BYTES))


def in_flight_pkts(rate_bps: int, delay_ms: float, jitter_ms: float) -> int:
    """Packets held by a delay stage at full rate (delay + 3 jitter), MTU-sized."""
    held_ms = delay_ms + 3 * jitter_ms
    return max(16, math.ceil(int(bdp_bytes(rate_bps, held_ms)) / MTU_BYTES * 1.25))
