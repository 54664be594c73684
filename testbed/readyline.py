"""Waiting for a child process's ``ready`` line: the one loop every launcher uses.

The testbed's long-running children (delay lines, role processes, the
gateway) print a line ``ready`` on stdout once they serve. The network
(testbed.net.apply), the scenario's roles (testbed.scenario.roles) and the
loopback launcher (testbed.pdd.run.procs) wait for it here and raise their
own error, naming their own log, on what this returns. No testbed imports.

Example::

    outcome = wait_ready(proc, 30.0)
    if outcome != READY: raise EmulationError(f"delay line {outcome}")
"""

from __future__ import annotations

import os
import select
import subprocess
import time

READY, EXITED, TIMED_OUT = "ready", "exited", "timed out"


def wait_ready(proc: subprocess.Popen, timeout_s: float, poll_s: float = 0.1) -> str:
    """READY once ``proc`` prints a line ``ready``; EXITED when it exits or closes its
    stdout first; TIMED_OUT after ``timeout_s``. Other lines are skipped.

    Reads the pipe's descriptor, not the buffered file: a buffered ``readline``
    would take several lines into its buffer at once, and polling the
    descriptor would then never see the ones behind the first. ``poll``, not
    ``select``: select refuses a descriptor numbered 1024 or more, which a
    long-lived launcher (``testbed suite``) can reach."""
    fd, pending = proc.stdout.fileno(), b""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if poller.poll(poll_s * 1000):
            chunk = os.read(fd, 4096)
            if not chunk:  # end of file: the child closed stdout or exited
                proc.poll()
                return EXITED
            *lines, pending = (pending + chunk).split(b"\n")
            if any(line.strip() == b"ready" for line in lines):
                return READY
        elif proc.poll() is not None:
            return EXITED
    return TIMED_OUT
