"""Owned-resource registry: every created thing with its undo, on disk too.

Owns the run's state file (``/run/testbed/tb{id}.json``, see naming.py) and
the in-process undo stack. Whoever creates a namespace shell, interface,
bridge, qdisc or process registers it here right after creating it; the
registry rewrites the state file atomically each time. ``teardown()`` runs
the undos in reverse, reports (never raises) their failures, and is
idempotent. If the testbed dies without teardown (SIGKILL), ``clean_stale``
reads state files and removes exactly the recorded objects: processes by
pid (checked against their recorded start time, so a recycled pid is never
signalled) and root-namespace interfaces by exact name. Nothing is ever
removed by pattern.

Another program may attach a process it started to a live run
(``attach_process``: ``testbed exec`` does, for the command it runs in a
host): it goes into the state file's ``attached`` list, under the run's
lock file (``tb{id}.lock``, flock) that the owner also takes to rewrite the
file, and leaves it with ``detach_process`` when it ends. The owner's
``stop_attached()`` / ``teardown()`` and ``clean_stale`` stop what is still
listed (SIGINT first, by pid and start time), before the run's own
processes.

Lifecycle: Registry(prefix) -> add_*() ... -> teardown() -> state file gone.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from testbed.errors import TestbedError
from testbed.net import naming

log = logging.getLogger(__name__)

ATTACHED_STOP_S = 10.0  # SIGINT, then SIGKILL: a benchmark client may write its results


def stop_process(pid: int, start_time: int | None, timeout_s: float = 3.0,
                 first: signal.Signals = signal.SIGTERM) -> bool:
    """Signal the process group of ``pid`` (``first``, default SIGTERM), wait,
    then SIGKILL; True if it existed.

    Only signals when the pid still has the recorded start time.
    """
    if start_time is not None and naming.pid_start_time(pid) != start_time:
        return False
    for sig, wait in ((first, timeout_s), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return True
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if _reap(pid):
                return True
            time.sleep(0.02)
    return True


def _reap(pid: int) -> bool:
    """True when pid is gone (reaping it if it is our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    except ChildProcessError:
        pass
    return not naming.process_alive(pid, None)  # a zombie of another parent counts as gone


def delete_root_link(name: str) -> bool:
    """Delete a root-namespace interface by exact name; False if absent."""
    r = subprocess.run(["ip", "link", "del", "dev", name], capture_output=True, text=True)
    return r.returncode == 0


@dataclass
class Registry:
    prefix: str
    undos: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    record: dict = field(default_factory=dict)

    def __post_init__(self):
        self.record = {"prefix": self.prefix, "owner_pid": os.getpid(),
                       "owner_start": naming.pid_start_time(os.getpid()),
                       "boot_id": naming.boot_id(), "created": time.time(),
                       "processes": [], "root_links": [], "paths": [], "attached": []}

    # -- registration -------------------------------------------------
    def open(self) -> None:
        naming.STATE_DIR.mkdir(parents=True, exist_ok=True)
        naming.state_lock(self.prefix).touch()
        self._write()

    def add_undo(self, what: str, undo: Callable[[], None]) -> None:
        self.undos.append((what, undo))

    def add_process(self, pid: int, what: str, undo: Callable[[], None] | None = None) -> None:
        entry = {"pid": pid, "start": naming.pid_start_time(pid), "what": what}
        self.record["processes"].append(entry)
        self._write()
        self.add_undo(f"stop {what} (pid {pid})", undo or (
            lambda: stop_process(pid, entry["start"])))

    def add_root_link(self, name: str, undo: Callable[[], None] | None = None) -> None:
        assert name.startswith(self.prefix), name
        self.record["root_links"].append(name)
        self._write()
        self.add_undo(f"delete {name}", undo or (lambda: delete_root_link(name)))

    def add_path(self, path: Path) -> None:
        self.record["paths"].append(str(path))
        self._write()

    def _write(self) -> None:
        path = naming.state_file(self.prefix)
        with _locked(self.prefix, create=True):
            # what other programs attached since the last write stays
            self.record["attached"] = _read_record(path).get("attached", [])
            _write_record(path, self.record)

    # -- teardown -----------------------------------------------------
    def stop_attached(self) -> list[dict]:
        """Stop the processes other programs attached to this run; return them."""
        path = naming.state_file(self.prefix)
        if not path.exists():
            return []
        with _locked(self.prefix, create=True):
            self.record["attached"] = _read_record(path).get("attached", [])
        stopped = list(self.record["attached"])
        _stop_attached(stopped)
        with _locked(self.prefix, create=True):
            left = [p for p in _read_record(path).get("attached", []) if p not in stopped]
            self.record["attached"] = left
            _write_record(path, self.record)
        return stopped

    def teardown(self) -> list[str]:
        """Stop attached processes, run undos in reverse; return the failures (never raises)."""
        failures = []
        try:
            self.stop_attached()
        except OSError as e:  # an unreadable state file: clean_record still stops them
            failures.append(f"stop attached processes: {e}")
        while self.undos:
            what, undo = self.undos.pop()
            try:
                undo()
            except Exception as e:  # noqa: BLE001 - reported, teardown goes on
                failures.append(f"{what}: {e}")
                log.warning("teardown: %s failed: %s", what, e)
        failures += clean_record(self.record)  # anything an undo missed
        path = naming.state_file(self.prefix)
        with _locked(self.prefix, create=True):
            late = _read_record(path).get("attached", [])  # attached during the undos
            path.unlink(missing_ok=True)
        naming.state_lock(self.prefix).unlink(missing_ok=True)
        _stop_attached(late)
        return failures


def _read_record(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def _write_record(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)


@contextmanager
def _locked(prefix: str, create: bool = False):
    """Hold the run's lock file (flock). Without ``create`` a missing lock file
    means the run is gone: TestbedError."""
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    try:
        fd = os.open(naming.state_lock(prefix), flags, 0o600)
    except FileNotFoundError:
        raise TestbedError(f"run {prefix} is not live (no {naming.state_lock(prefix)})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def attach_process(prefix: str, pid: int, what: str) -> dict | None:
    """Record ``pid`` (started by the caller) in live run ``prefix``'s state
    file, so the run's teardown and ``testbed clean`` stop it; its entry
    (None, nothing recorded, if the process has already ended).

    TestbedError if the run is not live (its state file is gone).
    """
    path = naming.state_file(prefix)
    entry = {"pid": pid, "start": naming.pid_start_time(pid), "what": what,
             "by": os.getpid()}
    if entry["start"] is None:
        return None  # gone already: a pid without its start time is never signalled
    with _locked(prefix):
        record = _read_record(path)
        if not record:
            raise TestbedError(f"run {prefix} is not live (no {path})")
        record.setdefault("attached", []).append(entry)
        _write_record(path, record)
    return entry


def detach_process(prefix: str, entry: dict | None) -> bool:
    """Remove ``entry`` (attach_process's) from the run's state file; False if
    the run or the entry is already gone."""
    path = naming.state_file(prefix)
    if entry is None:
        return False
    try:
        with _locked(prefix):
            record = _read_record(path)
            attached = record.get("attached", [])
            if entry not in attached:
                return False
            record["attached"] = [p for p in attached if p != entry]
            _write_record(path, record)
            return True
    except TestbedError:
        return False  # the run ended (and stopped what was attached)


def _stop_attached(entries: list[dict]) -> None:
    for p in reversed(entries):
        if p.get("start") is not None:  # never signal a pid whose start is unknown
            stop_process(p["pid"], p["start"], ATTACHED_STOP_S, first=signal.SIGINT)


def clean_record(record: dict) -> list[str]:
    """Remove what one state file records; return failures."""
    failures = []
    same_boot = record.get("boot_id") == naming.boot_id()
    if same_boot:
        _stop_attached(record.get("attached", []))
    for p in reversed(record.get("processes", [])):
        if same_boot:
            stop_process(p["pid"], p["start"])
    for name in reversed(record.get("root_links", [])):
        if Path(f"/sys/class/net/{name}").exists() and not delete_root_link(name):
            failures.append(f"could not delete interface {name}")
    for path in reversed(record.get("paths", [])):
        _remove_path(Path(path))
    return failures


def _remove_path(path: Path) -> None:
    if path.is_dir():
        for child in path.iterdir():
            child.unlink(missing_ok=True)
        path.rmdir()
    else:
        path.unlink(missing_ok=True)


def owner_alive(record: dict) -> bool:
    pid, start = record.get("owner_pid"), record.get("owner_start")
    return (record.get("boot_id") == naming.boot_id() and pid is not None
            and naming.pid_start_time(pid) == start)


def clean_stale(include_live: bool = False) -> list[tuple[str, list[str]]]:
    """Clean every recorded run whose owner is dead (or all with include_live).

    Returns (prefix, failures) per run cleaned.
    """
    done = []
    if not naming.STATE_DIR.is_dir():
        return done
    for path in sorted(naming.STATE_DIR.glob("tb*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            done.append((path.stem, [f"unreadable state file {path}: {e}"]))
            continue
        if owner_alive(record) and not include_live:
            continue
        failures = clean_record(record)
        if not failures:
            path.unlink(missing_ok=True)
            naming.state_lock(record.get("prefix", path.stem)).unlink(missing_ok=True)
        done.append((record.get("prefix", path.stem), failures))
    return done
