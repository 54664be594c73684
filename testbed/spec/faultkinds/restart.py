"""``restart``: SIGKILL to one role process, started again ``down_s`` later with
the same configuration and empty caches."""

from __future__ import annotations

from testbed.spec.faultkinds import kill
from testbed.spec.faultkinds.base import Export, end, start

NAME = "restart"
DOC = "role [instance] down_s                    kill -9, start it again after down_s"


def parse(f, base, duration_s):
    params, _ = kill.parse(f, base, duration_s)
    return params, f.num("down_s", lo=0, lo_open=True, unit="s")


def actions(fault, ops):
    p = fault.params
    return [start(fault, lambda: ops.kill(p["role"], p["instance"])),
            end(fault, lambda: ops.restart(p["role"], p["instance"]))]


def export(fault, nominal, instances, horizon_s, notes):
    return Export(step=kill.pod_failure(fault, instances, min(fault.end_s, horizon_s)))
