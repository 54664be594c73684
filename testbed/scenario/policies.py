"""A scenario's routing policies, loaded and checked before any network exists.

``check_policies(sc)`` loads every mode's policy (``testbed.pdd.policy.load_policy``:
a built-in by name, or ``path.py:Name`` relative to the scenario file) with its
``params``, and returns one SpecError per mode whose policy cannot be used: a missing
file, a module that does not import, a missing name, an object that is not a policy,
a parameter it does not take or refuses. ``testbed validate`` prints them (one line
each, exit 2); ``testbed run`` and ``testbed suite`` refuse the scenario on the first.
The spec made a file policy's path absolute (relative to the scenario file), and the
cluster config carries it so (``cluster_config.cluster_dict_for``).
"""

from __future__ import annotations

from testbed.errors import SpecError


def check_policies(sc) -> list[SpecError]:
    """Every mode's policy loaded with its params; the problems, one per mode."""
    from testbed.pdd.policy import load_policy

    problems = []
    for i, run in enumerate(sc.modes):
        if not run.policy:
            continue
        try:
            load_policy(run.policy, run.params, file=sc.file, field=f"modes[{i}].policy")
        except SpecError as err:
            problems.append(err)
    return problems
