"""Processes another program attaches to a live run's state file (registry.py).

``testbed exec`` attaches the command it runs; these check, with real
processes in a temporary state directory (no root), that the owner's
rewrites keep the attachment, that the owner's teardown and ``testbed
clean`` stop an attached process by pid (SIGINT first), and that a
detached or finished one is left alone.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testbed.errors import TestbedError
from testbed.net import naming, registry


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(naming, "STATE_DIR", tmp_path)
    return tmp_path


SLEEPER = """
import signal, sys, time
def on_int(signum, frame):
    open(sys.argv[1], "w").write("SIGINT")
    sys.exit(0)
signal.signal(signal.SIGINT, on_int)
print("ready", flush=True)
time.sleep(60)
"""


def _sleeper(tmp_path) -> subprocess.Popen:
    """A process in its own group that notes a SIGINT in ``proc.note``."""
    note = tmp_path / f"note-{len(list(tmp_path.glob('note-*')))}"
    note.touch()
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, str(note)], start_new_session=True,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.note = note
    return proc


def _interrupted(proc) -> bool:
    """True once ``proc`` is gone after a SIGINT (stop_process may have reaped it)."""
    try:
        proc.wait(5)
    except ChildProcessError:
        pass
    return proc.note.read_text() == "SIGINT" and not naming.process_alive(proc.pid, None)


def _attached(prefix: str) -> list[dict]:
    return json.loads(naming.state_file(prefix).read_text()).get("attached", [])


def test_an_attachment_survives_the_owners_rewrites_and_teardown_stops_it(state_dir):
    reg = registry.Registry("tb0a01")
    reg.open()
    proc = _sleeper(state_dir)
    try:
        entry = registry.attach_process("tb0a01", proc.pid, "exec sleep in client")
        reg.add_path(state_dir / "some-dir")  # the owner rewrites its state file
        assert [e["pid"] for e in _attached("tb0a01")] == [proc.pid]
        assert entry["start"] == naming.pid_start_time(proc.pid)
        assert reg.teardown() == []
        assert _interrupted(proc)
        assert not naming.state_file("tb0a01").exists()
        assert not naming.state_lock("tb0a01").exists()
    finally:
        proc.kill()


def test_a_detached_process_is_left_alone(state_dir):
    reg = registry.Registry("tb0a02")
    reg.open()
    proc = _sleeper(state_dir)
    try:
        entry = registry.attach_process("tb0a02", proc.pid, "exec sleep in client")
        assert registry.detach_process("tb0a02", entry) is True
        assert _attached("tb0a02") == []
        assert registry.detach_process("tb0a02", entry) is False
        reg.teardown()
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_stop_attached_stops_only_what_is_attached_and_keeps_the_run(state_dir):
    reg = registry.Registry("tb0a03")
    reg.open()
    procs = [_sleeper(state_dir), _sleeper(state_dir)]
    try:
        for p in procs:
            registry.attach_process("tb0a03", p.pid, f"exec {p.pid}")
        stopped = reg.stop_attached()
        assert sorted(e["pid"] for e in stopped) == sorted(p.pid for p in procs)
        assert all(_interrupted(p) for p in procs)
        assert _attached("tb0a03") == []
        assert naming.state_file("tb0a03").exists()  # the run itself is still up
    finally:
        for p in procs:
            p.kill()
        reg.teardown()


def test_clean_stops_what_a_dead_runs_state_file_lists_as_attached(state_dir):
    proc = _sleeper(state_dir)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        record = {"prefix": "tb0a04", "owner_pid": gone.pid, "owner_start": 1,
                  "boot_id": naming.boot_id(), "processes": [], "root_links": [],
                  "paths": [], "attached": [{"pid": proc.pid, "what": "exec",
                                             "start": naming.pid_start_time(proc.pid)}]}
        naming.state_file("tb0a04").write_text(json.dumps(record))
        naming.state_lock("tb0a04").touch()
        assert registry.clean_stale() == [("tb0a04", [])]
        assert _interrupted(proc)
        assert not naming.state_file("tb0a04").exists()
        assert not naming.state_lock("tb0a04").exists()
    finally:
        proc.kill()


def test_a_recycled_pid_is_not_signalled(state_dir):
    proc = _sleeper(state_dir)
    try:
        entry = {"pid": proc.pid, "start": naming.pid_start_time(proc.pid) + 1, "what": "x"}
        registry.clean_record({"boot_id": naming.boot_id(), "attached": [entry]})
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_attaching_to_a_run_that_is_not_live_is_an_error(state_dir):
    proc = _sleeper(state_dir)
    try:
        with pytest.raises(TestbedError, match="run tb0a05 is not live"):
            registry.attach_process("tb0a05", proc.pid, "exec")
        assert registry.detach_process("tb0a05", {"pid": proc.pid}) is False
    finally:
        proc.kill()
        proc.wait()
    assert registry.attach_process("tb0a05", proc.pid, "exec") is None  # already ended
