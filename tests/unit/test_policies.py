"""Routing policies (testbed/pdd/policy/): the built-ins, loading a user's policy file,
the router calling a policy (its placement, its errors), and the scenario's checks."""

from __future__ import annotations

import asyncio
import time
import copy
import re
import textwrap
from pathlib import Path

import pytest

from testbed.errors import SpecError
from testbed.pdd.policy import (BUILTIN, Candidates, DecoderCandidate, PCandidate, Placement,
                                RouteInputs, default_placement, load_policy)
from testbed.pdd.roles.router import Routed, RouterNode
from testbed.pdd.run.config import RouterConfig, TimingConfig, config_to_dict, parse_config
from testbed.types import Mode, Pipeline
from testbed.pdd.wire.protocol import Error, Report, Request, Role
from testbed.scenario.policies import check_policies
from testbed.spec.scenario import parse_scenario
from testbed.types import POLICIES

ROOT = Path(__file__).resolve().parents[2]
CFG = RouterConfig(relay_threshold_s=0.5)
TIMING = TimingConfig(kv_bytes_per_token=50_000, token_scale=1)
FULL = "RLD full: batch 8 of 8"
SHORT = RouteInputs(16384, 1000, 0.2, 15.0, None)  # PDD's rule: a short transfer, p-md
LONG = RouteInputs(16384, 1000, 2.0, 15.0, None)  # PDD's rule: relay


def test_the_builtins_are_the_names_the_spec_knows():
    assert tuple(BUILTIN) == POLICIES


@pytest.mark.parametrize("mode, policy", [(Mode.PDD, "PddRule"), (Mode.P_RLD, "PRld"),
                                          (Mode.CROSS_DC_PD, "CrossDcPd"),
                                          (Mode.SAME_DC_PD, "SameDcPd")])
def test_a_router_without_a_policy_runs_its_modes_rule(mode, policy):
    """No router.policy: the mode's built-in (whose decisions test_pdd_routing.py's table
    checks through choose_pipeline); a named one replaces it."""
    assert type(router_with(mode=mode.value).policy).__name__ == policy
    assert type(router_with("always-relay", mode=mode.value).policy).__name__ == "AlwaysRelay"


@pytest.mark.parametrize("inp, want", [
    (SHORT, Pipeline.P_RLD_MD), (LONG, Pipeline.P_RLD_MD),
    (RouteInputs(16384, 1000, 0.2, 15.0, FULL), Pipeline.P_RLD_MD),  # no room check
    (RouteInputs(16384, 1000, 0.2, 15.0, None, warmup=True), Pipeline.P_MD),
    (RouteInputs(16384, 1000, 0.2, 15.0, None, md_live=False), Pipeline.RLD_ONLY),
])
def test_always_relay(inp, want):
    assert BUILTIN["always-relay"]().decide(inp, CFG, TIMING).pipeline == want


@pytest.mark.parametrize("inp", [SHORT, LONG, RouteInputs(16384, 1000, 9.0, 1.0, None)])
def test_never_relay_is_the_cross_dc_baselines_decision(inp):
    assert BUILTIN["never-relay"]().decide(inp, CFG, TIMING) == \
        BUILTIN["cross-dc-pd"]().decide(inp, CFG, TIMING)


def test_prompt_threshold_relays_long_prompts_with_room():
    pol = load_policy("prompt-threshold", {"min_prompt_tokens": 16384})
    timing = TimingConfig(token_scale=32)
    assert pol.decide(RouteInputs(511, 100, 9.0, 1.0, None), CFG, timing).pipeline == \
        Pipeline.P_MD  # 511 x 32 = 16352 modeled tokens: below, whatever the WAN
    assert pol.decide(RouteInputs(512, 100, 0.0, 1.0, None), CFG, timing).pipeline == \
        Pipeline.P_RLD_MD
    d = pol.decide(RouteInputs(512, 100, 0.0, 1.0, FULL), CFG, timing)
    assert d.pipeline == Pipeline.P_MD and FULL in d.reason


@pytest.mark.parametrize("params", [{"min_prompt_tokens": -1}, {"min_prompt_tokens": 1.5},
                                    {"threshold": 3}])
def test_a_bad_parameter_names_the_params_field(params):
    with pytest.raises(SpecError, match=r"s.yaml: modes\[2\].params: expected parameters"):
        load_policy("prompt-threshold", params, file="s.yaml", field="modes[2].policy")


def test_an_unknown_policy_name_is_refused():
    with pytest.raises(SpecError, match="a built-in policy .* or path/to/file.py:Name"):
        load_policy("relay-everything")


POLICY_FILE = textwrap.dedent("""
    from testbed.pdd.policy import Placement, Policy, RouteDecision
    from testbed.types import Pipeline

    class Relay(Policy):
        def __init__(self, min_tokens=0):
            self.min_tokens = min_tokens

        def decide(self, inp, cfg, timing):
            if inp.prompt_len >= self.min_tokens:
                return RouteDecision(Pipeline.P_RLD_MD, f"mine: {inp.prompt_len}")
            return RouteDecision(Pipeline.P_MD, "mine: short")

    class LastMd(Relay):
        def place(self, c):
            return Placement(c.p[0].name, c.rld[0].name, sorted(x.name for x in c.md)[-1])

    class Raises(Relay):
        def decide(self, inp, cfg, timing):
            raise RuntimeError("no idea")

    class Nonsense(Relay):
        def decide(self, inp, cfg, timing):
            return "p-md"

    class Elsewhere(Relay):
        def place(self, c):
            return Placement("p9", None, None)

    NOT_A_POLICY = 3

    class NoDecide:
        pass
""")


@pytest.fixture
def policy_file(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(POLICY_FILE)
    return path


def test_a_policy_from_a_file_with_its_params(policy_file):
    pol = load_policy("mine.py:Relay", {"min_tokens": 100}, base_dir=policy_file.parent)
    assert pol.decide(RouteInputs(100, 1, 0.0, 1.0, None), CFG, TIMING).reason == "mine: 100"
    assert pol.decide(RouteInputs(99, 1, 0.0, 1.0, None), CFG, TIMING).pipeline == Pipeline.P_MD


@pytest.mark.parametrize("spec, params, field, expected", [
    ("missing.py:Relay", {}, "policy", "an existing Python file"),
    ("mine.py:Missing", {}, "policy", "a name defined in"),
    ("mine.py:NOT_A_POLICY", {}, "policy", "a policy class or factory"),
    ("mine.py:NoDecide", {}, "policy", "a policy: an object with decide"),
    ("mine.py:Relay", {"max_tokens": 3}, "params", "parameters mine.py:Relay takes"),
])
def test_a_policy_file_problem_names_the_file_field_and_value(policy_file, spec, params,
                                                               field, expected):
    with pytest.raises(SpecError) as err:
        load_policy(spec, params, base_dir=policy_file.parent, file="s.yaml",
                    field="modes[3].policy")
    assert str(err.value).startswith(f"s.yaml: modes[3].{field}: expected {expected}")


def test_a_module_that_does_not_import_is_a_spec_error(tmp_path):
    (tmp_path / "broken.py").write_text("import no_such_module_anywhere\n")
    with pytest.raises(SpecError, match="a module that imports.*ModuleNotFoundError"):
        load_policy("broken.py:X", base_dir=tmp_path)


def test_the_default_placement():
    c = Candidates(10, [PCandidate("p1", 5.0, 0), PCandidate("p0", 5.0, 4),
                        PCandidate("p2", 4.0, 0)],
                   [DecoderCandidate("rld1", 2, decode_s=1.0),
                    DecoderCandidate("rld0", 3, decode_s=1.2)],
                   [DecoderCandidate("md0", 1, 8, 0.1, 2.0), DecoderCandidate("md1", 0, 8, 0.1, 1.9),
                    DecoderCandidate("md2", 0, 0, 0.5, 1.9)])
    assert default_placement(c) == Placement("p2", "rld1", "md1")
    assert default_placement(Candidates(10, [], [], [])) == Placement(None, None, None)


def test_the_md_placement_weighs_a_held_prefix_against_load():
    # a held prefix is worth the transfer it saves: 2 s of WAN beats 0.3 s more decode
    sticky = [DecoderCandidate("md0", 4, 1900, 0.1, 2.3), DecoderCandidate("md1", 0, 0, 2.1, 2.0)]
    assert default_placement(Candidates(2000, [], [], sticky)).md == "md0"
    # one block of a common opening saves milliseconds: the load decides
    opening = [DecoderCandidate("md0", 4, 16, 2.08, 2.3), DecoderCandidate("md1", 0, 0, 2.1, 2.0)]
    assert default_placement(Candidates(2000, [], [], opening)).md == "md1"
    # equal costs: the one holding more, then the least loaded, then the name
    tie = [DecoderCandidate("md1", 1, 16, 1.0, 1.0), DecoderCandidate("md0", 0, 0, 1.0, 1.0),
           DecoderCandidate("md2", 0, 16, 1.5, 0.5)]
    assert default_placement(Candidates(2000, [], [], tie)).md == "md2"
    assert DecoderCandidate("x", 0, 0, 1.5, 0.5).cost_s == 2.0


FLEET = [("router", "router", "A"), ("p0", "prefill", "A"), ("rld0", "relay_decode", "A"),
         ("md0", "main_decode", "B"), ("md1", "main_decode", "B"), ("client", "client", "B")]


def router_with(policy: str = "", params: dict | None = None, mode: str = "pdd") -> RouterNode:
    instances = [{"name": n, "role": r, "host": "127.0.0.1", "dc": dc,
                  **({} if r == "client" else {"port": 7000 + i})}
                 for i, (n, r, dc) in enumerate(FLEET)]
    cfg = parse_config({"mode": mode, "instances": instances,
                        "router": {"policy": policy, "policy_params": params or {}}}, "<test>")
    return RouterNode(cfg, "router", transport=None)


def test_the_cluster_config_carries_the_policy_and_its_params(policy_file):
    cfg = router_with(f"{policy_file}:Relay", {"min_tokens": 5}).cfg
    again = parse_config(config_to_dict(cfg), "<again>")
    assert (again.router.policy, again.router.policy_params) == (f"{policy_file}:Relay",
                                                                 {"min_tokens": 5})
    with pytest.raises(SpecError, match="router.policy_params: expected an object"):
        parse_config({**config_to_dict(cfg), "router": {"policy_params": [1]}}, "<bad>")


FLEET3 = FLEET[:3] + [("md0", "main_decode", "B"), ("md1", "main_decode", "B"),
                      ("md2", "main_decode", "B"), ("client", "client", "B")]


def router_of(fleet, timing: dict | None = None) -> RouterNode:
    instances = [{"name": n, "role": r, "host": "127.0.0.1", "dc": dc,
                  **({} if r == "client" else {"port": 7000 + i})}
                 for i, (n, r, dc) in enumerate(fleet)]
    cfg = parse_config({"mode": "pdd", "instances": instances, "timing": timing or {},
                        "router": {"wan_prior_gbit": 100}}, "<test>")
    return RouterNode(cfg, "router", transport=None)


def hold(router: RouterNode, md: str, prompts) -> None:
    """``md`` holds a live request of each prompt (as the router counts them)."""
    for prompt in prompts:
        r = Routed(router._new_rid(), None, 0, Pipeline.P_MD,
                   {Role.PREFILL: "p0", Role.MAIN_DECODE: md})
        r.request = Request(tuple(prompt), 300, {})
        router.requests[r.rid] = r


def test_a_common_opening_does_not_pin_every_request_to_one_md():
    # the Mooncake slice's shape at token_scale 32: every prompt starts with one 16-token
    # block; md0 holds it and two requests, md1 and md2 nothing
    router = router_of(FLEET3, {"token_scale": 32})
    opening = list(range(16))
    router._md_mirror("md0").record(opening)
    hold(router, "md0", [opening + list(range(100, 1100))] * 2)
    prompt = opening + list(range(2000, 3000))
    c = router._candidates(prompt, 300)
    md0 = next(m for m in c.md if m.name == "md0")
    assert (md0.held_tokens, md0.active) == (16, 2)
    assert router._choose(prompt, c=c)[Role.MAIN_DECODE] == "md1"
    # a session's next turn, whose 1,000-token prefix md0 holds, stays there: moving it
    # would put ~1.6 GB (1,000 x 32 x 50 KB) more on the WAN than its decode there costs
    router._md_mirror("md0").record(prompt)
    turn2 = prompt + list(range(5000, 5100))
    c2 = router._candidates(turn2, 300)
    assert router._choose(turn2, c=c2)[Role.MAIN_DECODE] == "md0"
    md0, md1 = (next(m for m in c2.md if m.name == n) for n in ("md0", "md1"))
    assert md0.decode_s > md1.decode_s and md0.transfer_s < md1.transfer_s
    # ... unless md0's load costs more than the transfer it saves
    hold(router, "md0", [opening + list(range(100, 2100))] * 40)
    assert router._choose(turn2, max_out=300)[Role.MAIN_DECODE] == "md1"


def _held_prefix_on_a_loaded_md():
    """md0 holds 400 of a 1,001-token turn's tokens and 8 live requests; md1, md2 none."""
    router = router_of(FLEET3, {"token_scale": 32})
    prompt = list(range(1000))
    router._md_mirror("md0").record(prompt[:400])
    hold(router, "md0", [list(range(5000, 7000))] * 8)
    return router, prompt + [7]


def test_a_slower_wan_weighs_a_held_prefix_more():
    router, turn = _held_prefix_on_a_loaded_md()
    assert router._choose(turn, max_out=300)[Role.MAIN_DECODE] == "md1"  # at 100 Gbit/s
    router.wan._gbit = 1.0  # the capacity the model holds after a dip
    assert router._choose(turn, max_out=300)[Role.MAIN_DECODE] == "md0"


def test_a_congested_line_weighs_a_held_prefix_more():
    # the case above at 100 Gbit/s, but with the line carrying other transfers: each
    # would wait for the bytes md1 lacks too, so the prefix md0 holds is kept
    router, turn = _held_prefix_on_a_loaded_md()
    assert router._choose(turn, max_out=300)[Role.MAIN_DECODE] == "md1"
    for rid in range(12):
        router.wan.commit(10_000 + rid, 2e9, time.monotonic())
    c = router._candidates(turn, 300)
    md0, md1 = (next(m for m in c.md if m.name == n) for n in ("md0", "md1"))
    assert md1.delays_s == pytest.approx(12 * md1.transfer_s)
    assert md0.delays_s < md1.delays_s
    assert router._choose(turn, c=c)[Role.MAIN_DECODE] == "md0"


def test_a_policy_places_the_request(policy_file):
    router = router_with(f"{policy_file}:LastMd")
    assert router._choose([1, 2, 3])[Role.MAIN_DECODE] == "md1"
    assert router_with()._choose([1, 2, 3])[Role.MAIN_DECODE] == "md0"  # the router's
    # a re-served request takes the router's placement whatever the policy
    assert router._choose([1, 2, 3], use_policy=False)[Role.MAIN_DECODE] == "md0"


class FakePeer:
    role = Role.CLIENT

    def __init__(self):
        self.sent = []

    async def send(self, rid, message):
        self.sent.append((rid, message))
        return True


@pytest.mark.parametrize("name, why", [
    ("Raises", "policy error: RuntimeError: no idea"),
    ("Nonsense", "policy error: decide returned 'p-md', not a RouteDecision"),
    ("Elsewhere", "policy error in place: 'p9' is not a live PREFILL instance"),
])
def test_a_failing_policy_fails_that_request_with_its_error(policy_file, name, why):
    router = router_with(f"{policy_file}:{name}")
    client = FakePeer()
    asyncio.run(router._route(client, 7, Request([1, 2, 3], 4, {})))
    (rid1, report), (rid2, error) = client.sent
    assert (rid1, rid2) == (7, 7) and isinstance(report, Report) and isinstance(error, Error)
    assert report.data["pipeline"] is None and report.data["reason"] == why
    assert why in error.reason and router.requests == {}
    assert router.policy_errors == 1


def test_a_decision_records_the_policy_and_its_time(policy_file):
    router = router_with(f"{policy_file}:Relay")
    client = FakePeer()
    asyncio.run(router._route(client, 7, Request([1, 2, 3], 4, {})))
    info = client.sent[0][1].data
    assert info["policy"] == f"{policy_file}:Relay" and info["pipeline"] == "p-rld-md"
    assert info["reason"] == "mine: 3" and 0 < info["policy_us"] < 1e6


BASE = {
    "name": "s", "topology": str(ROOT / "topologies" / "two-dc.yaml"),
    "modes": ["pdd", "always-relay", "never-relay"],
    "workload": {"kind": "synthetic", "seed": 1, "n_requests": 4,
                 "arrival": {"process": "poisson", "rate_rps": 2},
                 "input_len": {"dist": "fixed", "tokens": 256},
                 "output_len": {"dist": "fixed", "tokens": 32}, "hit_rate": {"mean_pct": 50}},
    "expectations": [],
}


def test_a_scenario_names_builtin_and_file_policies(policy_file):
    data = copy.deepcopy(BASE)
    data["modes"].append({"name": "mine", "policy": f"{policy_file}:Relay",
                          "params": {"min_tokens": 8}})
    sc = parse_scenario(data, str(ROOT / "scenarios" / "t.yaml"))
    got = [(m.name, m.mode, m.policy, m.params) for m in sc.modes]
    assert got == [("pdd", Mode.PDD, "", {}), ("always-relay", Mode.PDD, "always-relay", {}),
                   ("never-relay", Mode.PDD, "never-relay", {}),
                   ("mine", Mode.PDD, f"{policy_file}:Relay", {"min_tokens": 8})]
    assert check_policies(sc) == []


def test_a_relative_policy_file_is_found_beside_the_scenario(policy_file):
    data = copy.deepcopy(BASE)
    data["modes"] = [{"name": "mine", "policy": "mine.py:Relay"}]
    sc = parse_scenario(data, str(policy_file.parent / "s.yaml"))
    assert sc.modes[0].policy == f"{policy_file}:Relay" and check_policies(sc) == []


def test_the_scenarios_policy_problems_one_per_mode(policy_file):
    data = copy.deepcopy(BASE)
    data["modes"] = [{"name": "a", "policy": "nope.py:X"}, {"name": "b", "policy": "mine.py:Y"},
                     {"name": "c", "policy": "mine.py:Relay", "params": {"bad": 1}}, "pdd"]
    sc = parse_scenario(data, str(policy_file.parent / "s.yaml"))
    problems = [str(e) for e in check_policies(sc)]
    assert len(problems) == 3
    assert "modes[0].policy: expected an existing Python file" in problems[0]
    assert "modes[1].policy: expected a name defined in" in problems[1]
    assert "modes[2].params: expected parameters" in problems[2]


@pytest.mark.parametrize("mode, where, expected", [
    ({"name": "a", "policy": "mine"}, "modes[0].policy", "a built-in policy"),
    ("always-relays", "modes[0]", "one of pdd"),
    ({"name": "a", "mode": "pdd", "params": {"x": 1}}, "modes[0].params", "params only with"),
    ({"name": "a", "policy": "prompt-threshold", "params": [1]}, "modes[0].params", "a mapping"),
])
def test_the_spec_refuses_a_malformed_policy_entry(mode, where, expected):
    data = copy.deepcopy(BASE)
    data["modes"] = [mode]
    with pytest.raises(SpecError, match=re.escape(where) + f".*expected {expected}"):
        parse_scenario(data, str(ROOT / "scenarios" / "t.yaml"))


def test_the_held_first_example_pins_requests_to_the_md_holding_an_opening():
    policy = load_policy("examples/policies/held_first.py:HeldFirst", base_dir=ROOT)
    opening = [DecoderCandidate("md0", 4, 16, 2.08, 2.3), DecoderCandidate("md1", 0, 0, 2.1, 2.0)]
    c = Candidates(2000, [PCandidate("p0", 1.0, 0)], [], opening)
    assert policy.place(c) == Placement("p0", None, "md0")  # the rank, not the cost
    assert default_placement(c).md == "md1"
