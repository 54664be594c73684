"""Run one command in a throwaway qemu guest whose kernel has sch_netem.

Owns one guest's lifecycle: prepare the cache (kernel + initramfs, under a
lock), write ``run.sh`` into the results folder, start qemu (software
emulation, ``-nic none``: the guest has no network to the outside, only its
own namespaces), wait for it to power off (or kill its process group at the
time limit), and read back what stage two wrote into the results folder::

    run.sh          the command (cd to the caller's cwd, then the command)
    stdout, stderr  its output
    exit_code       its exit status (absent: the guest did not get that far)
    guest_uptime    /proc/uptime when the command started (boot time)
    console.log     the serial console (kernel and init messages)

The guest sees the host's root read-only through 9p with a RAM overlay on
top (so /work/main/.venv works as is and nothing on the host changes), and
the results folder writable at the same path as on the host.

Example::

    r = run_in_guest(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                     Path(".cache/vm/runs/x"), timeout_s=120)
    r.exit_code, r.stdout, r.wall_s
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from testbed.vm.errors import VmError, VmTimeout
from testbed.vm.initramfs import FAIL_MARKER, HOST_TAG, RESULTS_TAG, ensure_initramfs
from testbed.vm.kernel import GuestKernel, ensure_kernel

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = PROJECT_ROOT / ".cache" / "vm"
QEMU = "qemu-system-x86_64"
OUTPUT_FILES = ("run.sh", "stdout", "stderr", "exit_code", "guest_uptime", "console.log")
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._+/@:-]*$")  # no blanks, quotes, commas (qemu, cmdline)


@dataclass(frozen=True)
class VmConfig:
    cache_dir: Path = field(default=DEFAULT_CACHE, metadata={"help": "kernel, initramfs, runs"})
    memory_mb: int = field(default=2048, metadata={"help": "4096 if torch runs inside"})
    cpus: int = field(default=2, metadata={"help": "guest vCPUs (TCG threads)"})
    qemu: str = field(default=QEMU, metadata={"help": "qemu binary"})
    kernel_args: str = field(default="", metadata={"help": "extra kernel command-line words"})


@dataclass(frozen=True)
class GuestResult:
    exit_code: int
    stdout: str
    wall_s: float               # qemu start -> qemu exit, on the host
    stderr: str = ""
    boot_s: float | None = None  # guest kernel start -> command start
    results_dir: Path | None = None


@dataclass(frozen=True)
class Prepared:
    kernel: GuestKernel
    initramfs: Path


@contextmanager
def locked(cache: Path):
    """Serialise cache preparation between processes (flock on cache/.lock)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def prepare(config: VmConfig = VmConfig(), refresh: bool = False) -> Prepared:
    """Kernel and initramfs in the cache (downloaded/built only the first time)."""
    if shutil.which(config.qemu) is None:
        raise VmError(f"{config.qemu} not found: apt-get install qemu-system-x86")
    cache = config.cache_dir.resolve()
    with locked(cache):
        kernel = ensure_kernel(cache, refresh)
        return Prepared(kernel, ensure_initramfs(cache, kernel))


def qemu_args(config: VmConfig, prep: Prepared, results: Path) -> list[str]:
    append = (f"console=ttyS0 quiet loglevel=3 panic=-1 "
              f"tbvm_results={results} tbvm_modules={prep.kernel.modules_dir.resolve()} "
              f"{config.kernel_args}").strip()
    if len(append) > 2000:
        raise VmError("kernel command line too long (results path?)")
    share = "security_model=none,multidevs=remap"
    return [config.qemu, "-machine", "q35", "-accel", "tcg,thread=multi", "-cpu", "max",
            "-smp", str(config.cpus), "-m", str(config.memory_mb),
            "-nographic", "-no-reboot", "-nic", "none",
            "-kernel", str(prep.kernel.vmlinux.resolve()), "-initrd", str(prep.initramfs),
            "-append", append,
            "-virtfs", f"local,path=/,mount_tag={HOST_TAG},readonly=on,{share}",
            "-virtfs", f"local,path={results},mount_tag={RESULTS_TAG},{share}"]


def command_script(command: str | os.PathLike | Sequence[str], cwd: Path) -> str:
    """run.sh: cd to ``cwd``; then a script file, an argv list or a shell line."""
    if isinstance(command, (list, tuple)):
        line = "exec " + shlex.join(str(a) for a in command)
    elif Path(command).is_file():
        path = Path(command).resolve()
        line = f"exec {shlex.quote(str(path))}" if os.access(path, os.X_OK) \
            else f"exec /bin/sh {shlex.quote(str(path))}"
    else:
        line = str(command)
    return f"cd {shlex.quote(str(cwd))} || exit 126\n{line}\n"


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM qemu's process group, wait, SIGKILL, reap."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def run_in_guest(command: str | os.PathLike | Sequence[str], results_dir: os.PathLike,
                 timeout_s: float = 600.0, config: VmConfig = VmConfig(),
                 cwd: os.PathLike | None = None) -> GuestResult:
    """Boot a guest, run ``command`` as root in it, power off; its result.

    ``command``: a script file, an argv list, or a shell command line. It
    runs in ``cwd`` (default: the caller's), with the host's files at their
    usual paths (read-only underneath, writes kept in guest RAM) and
    ``results_dir`` (created if missing) writable and shared with the host.
    Raises VmTimeout past ``timeout_s`` (boot included), VmError if the
    guest does not report an exit code.
    """
    results = Path(results_dir).resolve()
    if not _SAFE_PATH.match(str(results)) or results == Path("/"):
        raise VmError(f"results folder {results}: use a path without blanks, quotes or commas")
    results.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_FILES:
        (results / name).unlink(missing_ok=True)
    prep = prepare(config)
    (results / "run.sh").write_text(command_script(command, Path(cwd or os.getcwd()).resolve()))
    console = results / "console.log"
    t0 = time.monotonic()
    with open(console, "wb") as out:
        proc = subprocess.Popen(qemu_args(config, prep, results), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise VmTimeout(f"guest still running after {timeout_s:g} s, killed; console "
                            f"tail:\n{_tail(console)}") from None
        finally:
            _stop(proc)
    wall = time.monotonic() - t0
    code_file = results / "exit_code"
    if not code_file.is_file():
        fail = [ln for ln in _read(console).splitlines() if FAIL_MARKER in ln]
        why = fail[-1] if fail else f"qemu exited {rc} before the command finished"
        raise VmError(f"guest did not report an exit code: {why}; console tail:\n"
                      f"{_tail(console)}")
    uptime = _read(results / "guest_uptime").split()
    return GuestResult(int(code_file.read_text().strip()), _read(results / "stdout"), wall,
                       _read(results / "stderr"), float(uptime[0]) if uptime else None, results)
