"""``kill``: SIGKILL to one role process (``instance``, or the role's first);
it stays dead."""

from __future__ import annotations

from testbed.errors import PlanError
from testbed.spec.faultkinds.base import Export, Step, start

NAME = "kill"
DOC = "role (main_decode|relay_decode|prefill|router) [instance]  kill -9 a role process"
KILLABLE_ROLES = ("main_decode", "relay_decode", "prefill", "router")


def parse(f, base, duration_s):
    return {"role": f.choice("role", KILLABLE_ROLES), "instance": f.str("instance", None)}, \
        duration_s


def actions(fault, ops):
    p = fault.params
    return [start(fault, lambda: ops.kill(p["role"], p["instance"]))]


def export(fault, nominal, instances, horizon_s, notes):
    # A Deployment would restart a deleted pod, which is not a kill: the pod fails
    # until the run's end.
    return Export(step=pod_failure(fault, instances, horizon_s))


def pod_failure(fault, instances: dict[str, list[str]], end_s: float) -> Step:
    """The instance's pod failed from the fault's start to ``end_s``."""
    p = fault.params
    names = instances.get(p["role"], [])
    if p["instance"] is not None and p["instance"] not in names:
        raise PlanError(f"fault {fault.index} ({fault.kind}): no {p['role']} instance "
                        f"{p['instance']!r} (instances: {', '.join(names) or 'none'})")
    if not names:
        raise PlanError(f"fault {fault.index} ({fault.kind}): this mode has no {p['role']} "
                        "instance")
    return Step(fault.at_s, end_s - fault.at_s, "pod-failure", p["instance"] or names[0],
                fault.index, fault.kind)
