"""Scheduler hints of a role process (testbed.pdd.run.sched), read back from the kernel.

Each case runs in a child process: the hints must not touch pytest's own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = """
import ctypes, json, os, struct, sys
from testbed.pdd.run.sched import prefer_latency, _ATTR, _SCHED_SETATTR
from testbed.pdd.wire.fields import Role
import platform

def kernel_slice():
    nr = _SCHED_SETATTR.get(platform.machine())
    if nr is None:
        return None
    buf = ctypes.create_string_buffer(_ATTR.size)
    if ctypes.CDLL(None, use_errno=True).syscall(nr + 1, 0, buf, _ATTR.size, 0) != 0:
        return None
    return _ATTR.unpack(buf.raw)[5]

before = kernel_slice()
applied = prefer_latency(Role[sys.argv[1]])
print(json.dumps({"before": before, "applied": applied, "slice": kernel_slice(),
                  "nice": os.getpriority(os.PRIO_PROCESS, 0)}))
"""


def _child(role: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, role], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return json.loads(out)


@pytest.mark.parametrize("role, hub", [("ROUTER", True), ("CLIENT", True),
                                       ("RELAY_DECODE", True), ("MAIN_DECODE", False),
                                       ("PREFILL", False)])
def test_the_kernel_holds_what_prefer_latency_reports(role, hub):
    from testbed.pdd.run.sched import HUB_NICE, SLICE_NS

    got = _child(role)
    applied = got["applied"]
    assert got["nice"] == applied["nice"]  # what the kernel says, not what was asked
    if hub and os.geteuid() == 0:
        assert applied["nice"] == HUB_NICE
    elif hub:  # without root the raise is refused, and said so
        assert any(r.startswith(f"nice {HUB_NICE}") for r in applied["refused"]), applied
    else:
        assert applied["nice"] == 0
    if got["before"]:  # a kernel that reports a slice (EEVDF, >= 6.12) takes a custom one
        assert applied["slice_ns"] == SLICE_NS == got["slice"], got
    else:
        assert got["slice"] in (None, 0, got["before"]), got
    assert (applied["slice_ns"] is None) == any(r.startswith("slice") for r in applied["refused"])


FRONT_END_CHILD = """
import json, os
from testbed.pdd.run.sched import prefer_front_end
applied = prefer_front_end()
print(json.dumps({"applied": applied, "policy": os.sched_getscheduler(0),
                  "priority": os.sched_getparam(0).sched_priority,
                  "rr": os.SCHED_RR}))
"""


def test_the_front_end_runs_round_robin_as_root_and_says_so_when_refused():
    from testbed.pdd.run.sched import FRONT_END_RT_PRIORITY

    got = json.loads(subprocess.run([sys.executable, "-c", FRONT_END_CHILD],
                                    capture_output=True, text=True, timeout=60,
                                    check=True).stdout)
    applied = got["applied"]
    if applied["rt_priority"] is not None:  # what the kernel says, not what was asked
        assert (got["policy"], got["priority"]) == (got["rr"], FRONT_END_RT_PRIORITY)
        assert applied["rt_priority"] == FRONT_END_RT_PRIORITY
    else:
        assert got["policy"] != got["rr"]
        assert any(r.startswith(f"SCHED_RR {FRONT_END_RT_PRIORITY}:")
                   for r in applied["refused"]), applied
    if os.geteuid() == 0 and os.path.exists("/proc/sys/kernel/sched_rt_runtime_us"):
        assert applied["rt_priority"] == FRONT_END_RT_PRIORITY, applied
