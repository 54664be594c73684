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
