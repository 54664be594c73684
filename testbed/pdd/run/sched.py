"""What a role process asks of the host's CPU scheduler, so that sharing cores delays it little.

Owns ``prefer_latency``: called once at a role process's start, before its
event loop runs. A real deployment gives every instance machines of its own;
here a dozen role processes, the client and the delay lines share two cores,
and a role woken by a frame can wait for a core behind another role's burst.
That wait is the event-loop lag the fidelity verdict judges
(testbed/report/fidelity.py). Two hints, both best effort (a refused one is
reported, never fatal):

- every role process asks for a short scheduler slice (``SLICE_NS``, 0.1 ms:
  ``sched_attr.sched_runtime`` of SCHED_OTHER, the EEVDF scheduler's
  per-task slice, Linux >= 6.12; older kernels ignore it): a task with a
  short slice gets an early virtual deadline when it wakes, so it preempts
  a busier task instead of waiting for that task's slice (default 1.4 ms on
  a 2-core machine) to end. Its share of the CPU is unchanged.
- the hubs run at ``HUB_NICE`` (-10, ~9x the CPU weight of nice 0; needs
  root): the router and the client, which every token of every request
  crosses, and the relay decoder, which every relayed request's KV and
  eager tokens cross (one RLD serves six P in scenarios/paper/fleet.yaml).
  They stand for machines of their own and, being the busiest, wait the
  longest when they share. The client is also the instrument: its lag is
  added to every TTFT and TPOT it measures.

Measured on the 2-core reference machine (2026-12-05, the pdd mode of
scenarios/paper/fleet.yaml, 120 requests, both cores 50-62% busy; event
loop lag p99 of router / rld1 / client, one run each unless a range):
without hints 6.3-6.9 / 6.3-8.9 / 5.3 ms (three runs); short slices alone
5.8-6.9 / 4.5-4.9 / 3.2-4.5 ms (two); short slices with router and client
at nice -10 4.1-6.3 / 4.9-9.7 / 2.9-3.8 ms (two); with RLD at nice -10 too
4.1-5.3 / 4.9-6.9 / 2.7-4.1 ms (two). The spread from run to run is as
large as the hints' effect: they help the hubs' typical run, but what
brought the fleet under the 5 ms tolerance was the delay lines waking
less often (their kernel-timestamped arrivals, testbed/net/delayline.py;
docs/paper-fleet.md). The delay lines stay above all of these
(SCHED_FIFO).

The OpenAI gateway (the deployment's front end, testbed/pdd/roles/gateway.py)
asks for more: ``prefer_front_end`` runs it under SCHED_RR at
``FRONT_END_RT_PRIORITY`` (1, below the delay lines' SCHED_FIFO 10), so it
runs as soon as it has work, ahead of every normal process. Why: a
benchmark client on the same two cores (AIPerf at concurrency 1024) opens
and drops hundreds of connections at once, and at those instants the
gateway at nice -10 waited for a core longer than it ran (its main
thread's run delay, /proc/self/schedstat: 0.67 s in one second, 19.6 s
over the run against 15.4 s of CPU), which is what held ``/health`` late
(up to 244 ms); under SCHED_RR it waited 0.29 s in a whole run and
answered within 72 ms in three runs (docs/robustness.md, "Overload at the
gateway"). It is I/O-bound (~10% of a core under that load); what it costs
the roles, which it preempts when it wakes, is within that day's spread
of throughput (perhaps up to ~10% at concurrency 1024). The kernel's RT
throttling (sched_rt_runtime_us) keeps a runaway from taking a core whole.
Refused without root, then the client role's hints apply.

Example::

    applied = prefer_latency(Role.ROUTER)
    # {"slice_ns": 100000, "nice": -10, "rt_priority": None, "refused": []}
    applied = prefer_front_end()   # {..., "rt_priority": 1, ...} as root
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

from testbed.pdd.wire.fields import Role

SLICE_NS = 100_000  # the kernel's lower bound for a custom slice
HUB_NICE = -10
HUBS = frozenset({Role.ROUTER, Role.CLIENT, Role.RELAY_DECODE})
FRONT_END_RT_PRIORITY = 1  # SCHED_RR; the delay lines run SCHED_FIFO 10 (testbed.net.delayline)
_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}  # sched_getattr is this + 1 on both
_SCHED_OTHER = 0
# struct sched_attr, SCHED_ATTR_SIZE_VER1: size, policy, flags, nice, priority, runtime,
# deadline, period, util_min, util_max
_ATTR = struct.Struct("IIQiIQQQII")


def _sched_attr_call(offset: int, *args) -> str | None:
    """sched_setattr (offset 0) or sched_getattr (offset 1) on this thread; None, or why
    it failed."""
    nr = _SCHED_SETATTR.get(platform.machine())
    if nr is None:
        return f"no sched_setattr number for {platform.machine()}"
    if ctypes.CDLL(None, use_errno=True).syscall(nr + offset, 0, *args) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def set_slice(slice_ns: int, nice: int) -> str | None:
    """Ask for a ``slice_ns`` scheduler slice for this thread (and the threads and
    processes it starts later); None, or why not."""
    attr = ctypes.create_string_buffer(
        _ATTR.pack(_ATTR.size, _SCHED_OTHER, 0, nice, 0, slice_ns, 0, 0, 0, 0), _ATTR.size)
    return _sched_attr_call(0, attr, 0)


def kernel_slice_ns() -> int | None:
    """This thread's scheduler slice as the kernel reports it (0 on kernels without
    custom slices; None if it cannot be read)."""
    attr = ctypes.create_string_buffer(_ATTR.size)
    if _sched_attr_call(1, attr, _ATTR.size, 0) is not None:
        return None
    return _ATTR.unpack(attr.raw)[5]


def prefer_latency(role: Role) -> dict:
    """Apply this module's hints for a process of ``role``; what was applied and what
    was refused (``{"slice_ns", "nice", "rt_priority": None, "refused": [...]}``)."""
    applied: dict = {"slice_ns": None, "nice": os.getpriority(os.PRIO_PROCESS, 0),
                     "rt_priority": None, "refused": []}
    if role in HUBS:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, HUB_NICE)
            applied["nice"] = HUB_NICE
        except OSError as err:
            applied["refused"].append(f"nice {HUB_NICE}: {err.strerror}")
    why = set_slice(SLICE_NS, applied["nice"])
    if why is None and kernel_slice_ns() != SLICE_NS:
        why = "the kernel keeps its own slice (custom slices: Linux >= 6.12)"
    if why is None:
        applied["slice_ns"] = SLICE_NS
    else:
        applied["refused"].append(f"slice {SLICE_NS} ns: {why}")
    return applied


def prefer_front_end() -> dict:
    """The gateway's hints: the client role's (``prefer_latency``), then SCHED_RR at
    ``FRONT_END_RT_PRIORITY`` for this process (and the threads it starts later); what was
    applied and what was refused, ``rt_priority`` None when refused."""
    applied = prefer_latency(Role.CLIENT)
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(FRONT_END_RT_PRIORITY))
        applied["rt_priority"] = FRONT_END_RT_PRIORITY
    except OSError as err:
        applied["refused"].append(f"SCHED_RR {FRONT_END_RT_PRIORITY}: {err.strerror}")
    return applied
