"""metadata.json: what ran, on what, from which code.

Owns the run's provenance record (pantheon's metadata file): the resolved
scenario as plain data, backend, k, kernel, Python and package versions,
git revision, seed, modes, start time, hostname.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import platform
import socket
import subprocess
import time
from importlib import metadata as importlib_metadata
from pathlib import Path

PACKAGES = ("testbed", "torch", "pyroute2", "mininet", "scapy", "PyYAML", "numpy", "matplotlib")


def plain(obj):
    """Dataclasses/enums/paths/tuples -> JSON-ready data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.compare or f.name != "extra"}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def git_revision() -> str:
    repo = Path(__file__).resolve().parents[2]
    try:
        r = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return r.stdout.strip() + ("-dirty" if dirty else "") if r.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = None
    return out


def tcp_congestion_control() -> str | None:
    """The kernel's default TCP congestion control (new namespaces start with it): it
    decides how KV transfers react to loss (bbr keeps its rate up to ~5% loss on the
    emulated WAN and falls into timeouts beyond: docs/backends.md)."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    except OSError:
        return None


def write_metadata(out_dir: Path, scenario, backend: str, scale: float, seed: int,
                   workload_stats) -> dict:
    resolved = plain(scenario)
    resolved["expectations"] = [e.as_dict() for e in scenario.expectations]  # no null keys
    meta = {
        "scenario": scenario.name, "scenario_file": scenario.file,
        "resolved": resolved, "topology": plain(scenario.topology),
        "backend": backend, "scale": scale, "seed": seed,
        "modes": [m.value for m in scenario.modes],
        "workload_stats": plain(workload_stats),
        "kernel": platform.release(), "tcp_congestion_control": tcp_congestion_control(),
        "python": platform.python_version(),
        "packages": versions(), "git_revision": git_revision(),
        "started_wall": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "hostname": socket.gethostname(),
        "pid": os.getpid(),
    }
    (out_dir / "metadata.json").write_text(json.dumps(meta, indent=1, default=str))
    return meta
