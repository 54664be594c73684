"""Routing policies: PDD's rule, the baselines and alternatives, and user policies from a file.

One module per built-in (``pdd.py``: PDD's rule; ``p_rld.py``; ``baselines.py``:
cross-dc-pd / never-relay and same-dc-pd; ``always_relay.py``;
``prompt_threshold.py``), the interface in ``base.py`` (what a policy gets and
answers, what it may do), and ``load_policy``: a built-in by name
(``testbed.types.POLICIES``) or ``path/to/file.py:Name`` with parameters, checked
before any network exists (``testbed validate``, ``testbed run``) and loaded again by
the router process. Pure: no I/O but reading the policy's file.

Example::

    policy = load_policy("prompt-threshold", {"min_prompt_tokens": 16384})
    policy.decide(RouteInputs(...), cfg.router, cfg.timing).pipeline
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Mapping

from testbed.errors import SpecError
from testbed.pdd.policy.always_relay import AlwaysRelay
from testbed.pdd.policy.base import (POLICY_BUDGET_S, Candidates, DecoderCandidate,  # noqa: F401
                                     PCandidate, Placement, Policy, RouteDecision, RouteInputs,
                                     default_placement, guard)
from testbed.pdd.policy.baselines import CrossDcPd, NeverRelay, SameDcPd
from testbed.pdd.policy.p_rld import PRld
from testbed.pdd.policy.pdd import PddRule
from testbed.pdd.policy.prompt_threshold import PromptThreshold
from testbed.types import is_file_policy

BUILTIN: dict[str, type] = {c.name: c for c in (PddRule, CrossDcPd, SameDcPd, PRld, AlwaysRelay,
                                                NeverRelay, PromptThreshold)}


def load_policy(spec: str, params: Mapping[str, Any] | None = None, *, base_dir: Path = Path("."),
                file: str = "<config>", field: str = "policy") -> Any:
    """The policy ``spec`` names, built with ``params``; a file path is relative to
    ``base_dir``. Every problem is a SpecError naming ``file``, the field and the value:
    an unknown name, a missing file, a module that does not import, a missing name, an
    object that is not a policy, a parameter it does not take or refuses."""
    params = dict(params or {})
    pfield = field.rsplit("policy", 1)[0] + "params" if field.endswith("policy") else "params"
    if is_file_policy(spec):
        factory = _from_file(spec, base_dir, file, field)
    elif spec in BUILTIN:
        factory = BUILTIN[spec]
    else:
        raise SpecError(file, field, "a built-in policy (" + ", ".join(BUILTIN) + ") or "
                        "path/to/file.py:Name", spec)
    try:
        policy = factory(**params)
    except (TypeError, ValueError) as err:
        raise SpecError(file, pfield, f"parameters {spec} takes", f"{params} ({err})") from None
    if not callable(getattr(policy, "decide", None)):
        raise SpecError(file, field, "a policy: an object with decide(inp, cfg, timing)",
                        f"{spec} ({type(policy).__name__})")
    return policy


def _from_file(spec: str, base_dir: Path, file: str, field: str) -> Any:
    path_s, _, name = spec.rpartition(":")
    path = Path(path_s) if Path(path_s).is_absolute() else base_dir / path_s
    if not path.is_file():
        raise SpecError(file, field, "an existing Python file",
                        path_s if path == Path(path_s) else f"{path_s} (looked for {path})")
    mod_name = f"testbed_user_policy_{abs(hash(str(path.resolve())))}"
    try:
        mspec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(mspec)
        sys.modules[mod_name] = module  # dataclasses and pickling look modules up by name
        mspec.loader.exec_module(module)
    except Exception as err:  # a user's module: anything it raises is its problem
        sys.modules.pop(mod_name, None)
        raise SpecError(file, field, "a module that imports", f"{path_s} ({type(err).__name__}: "
                        f"{err})") from None
    factory = getattr(module, name, None)
    if factory is None:
        raise SpecError(file, field, f"a name defined in {path_s}", name)
    if not callable(factory):
        raise SpecError(file, field, "a policy class or factory", f"{name} ({type(factory).__name__})")
    return factory
