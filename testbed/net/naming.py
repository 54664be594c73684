"""The one naming scheme for kernel objects the testbed creates.

Every run gets a run id of 4 hex digits and the prefix ``tb{id}``. Objects
that live in the root network namespace carry the prefix, so two runs never
collide and ``testbed clean`` can tell what it owns:

- DC switch (Linux bridge):      ``tb{id}s{dc}``        e.g. ``tb3f2asa``
- switch-side veth of a host:    ``tb{id}s{dc}-{n}``    e.g. ``tb3f2asa-3``
- the run's state file:          ``STATE_DIR/tb{id}.json``
- its lock (state-file writers):  ``STATE_DIR/tb{id}.lock``
- the run's control sockets:     ``STATE_DIR/tb{id}/...``

Objects inside the emulated hosts' own (anonymous) namespaces cannot
collide with anything outside them and use readable names:

- host interfaces:               ``{host}-eth{n}``     (spec checks <= 15 chars)
- gateways:                      ``gw{dc}``; the WAN node: ``wan``
- the WAN node's bridge (netem backend only): ``wanbr``

The longest root-namespace name is 6 + 1 + 4 + 1 + 2 = 14 characters.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from testbed.errors import EmulationError

STATE_DIR = Path("/run/testbed")
WAN_NODE = "wan"
WAN_BRIDGE = "wanbr"


def new_run_prefix() -> str:
    """A fresh prefix not used by any state file present."""
    for _ in range(100):
        prefix = "tb" + secrets.token_hex(2)
        if not (STATE_DIR / f"{prefix}.json").exists():
            return prefix
    raise EmulationError(f"could not find a free run prefix in {STATE_DIR} after 100 tries "
                         "(run 'testbed clean')")


def switch_name(prefix: str, dc: str) -> str:
    return f"{prefix}s{dc}"


def switch_port(prefix: str, dc: str, n: int) -> str:
    name = f"{switch_name(prefix, dc)}-{n}"
    assert len(name) <= 15, name
    return name


def state_file(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.json"


def state_lock(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.lock"


def socket_dir(prefix: str) -> Path:
    return STATE_DIR / prefix


def pid_start_time(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (None if gone).

    Recorded with every pid so that cleanup never signals a recycled pid.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def process_alive(pid: int, start_time: int | None) -> bool:
    """True if ``pid`` runs (not a zombie) and, if given, has ``start_time``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    if fields[0] == "Z":
        return False
    return start_time is None or int(fields[19]) == start_time


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


__all__ = ["STATE_DIR", "new_run_prefix", "switch_name", "switch_port", "state_file",
           "state_lock", "socket_dir", "pid_start_time", "process_alive", "boot_id", "WAN_NODE",
           "WAN_BRIDGE"]
