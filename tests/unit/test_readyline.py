"""wait_ready: a child's 'ready' line, its early exit and a hang, told apart."""

from __future__ import annotations

import subprocess
import sys

from testbed.readyline import EXITED, READY, TIMED_OUT, wait_ready


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def test_ready_after_other_lines():
    proc = _child("import time; print('starting', flush=True); print('ready', flush=True); "
                  "time.sleep(30)")
    try:
        assert wait_ready(proc, 10.0) == READY
    finally:
        proc.kill()
        proc.wait()


def test_an_exit_before_ready_is_told():
    proc = _child("import sys; print('oops', flush=True); sys.exit(3)")
    assert wait_ready(proc, 10.0) == EXITED
    assert proc.wait(timeout=5) == 3


def test_a_hang_times_out():
    proc = _child("import time; time.sleep(30)")
    try:
        assert wait_ready(proc, 0.3) == TIMED_OUT and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_a_descriptor_numbered_past_1024_is_read():
    # a launcher that has opened many files (testbed suite, after 18 scenarios) gets pipe
    # descriptors past select()'s 1024; the fleet's run failed there with "filedescriptor
    # out of range in select()"
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1600:
        import pytest
        pytest.skip(f"the descriptor limit ({hard}) is below 1600")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1600), hard))
    proc = _child("import time; print('ready', flush=True); time.sleep(30)")
    high = 1500
    try:
        os.dup2(proc.stdout.fileno(), high)
        proc.stdout.close()
        proc.stdout = os.fdopen(high, "rb")
        assert wait_ready(proc, 10.0) == READY
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
