"""The router's decision record (testbed/decision.py): the reader refuses what the
declaration does not allow, naming the field, and re-served rounds add to a decision."""

from __future__ import annotations

import dataclasses

import pytest

from testbed.decision import Decision, Reserve, Routing

ROUTING = Routing(**{f.name: 1 for f in dataclasses.fields(Routing)} | {"policy": "pdd"})
ROUTED = Decision("p-rld-md", "long transfer (2.00 s): relay", "pdd",
                  ("MAIN_DECODE", "PREFILL", "RELAY_DECODE"),
                  {"MAIN_DECODE": "md0", "PREFILL": "p0", "RELAY_DECODE": "rld0"}, ROUTING)


def test_the_on_disk_keys_are_flat_with_the_budget_nested():
    data = ROUTED.data()
    assert data["rld_budget"] == {"max_batch": 1, "kv_tokens": 1}
    assert "rld_budget_max_batch" not in data and data["t_route"] == 1
    assert data["instances"]["PREFILL"] == "p0"


@pytest.mark.parametrize("key,value,field", [
    ("predicted_wan_s", "soon", "decision.predicted_wan_s"),
    ("predicted_wan_s", float("nan"), "decision.predicted_wan_s"),
    ("wan_backlog_bytes", 1.5, "decision.wan_backlog_bytes"),
    ("rld_active", True, "decision.rld_active"),
    ("policy", None, "decision.policy"),
    ("reason", 3, "decision.reason"),
    ("roles", "PREFILL", "decision.roles"),
    ("rld_budget", 4, "decision.rld_budget"),
    ("instances", {"PREFILL": 0}, "decision.instances"),
    ("pipeline", 1, "decision.pipeline"),
])
def test_a_bad_field_is_refused_by_name(key, value, field):
    data = dict(ROUTED.data(), **{key: value})
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Decision.read(data)


def test_a_routed_record_missing_an_input_is_refused():
    data = ROUTED.data()
    del data["wan_margin_s"]
    with pytest.raises(ValueError, match=r"decision\.wan_margin_s: expected number, got None"):
        Decision.read(data)


def test_a_refusal_has_no_routing_and_no_roles():
    d = Decision.read({"pipeline": None, "reason": "busy", "roles": [], "mode": "pdd"})
    assert d.refused and d.routing is None and d.roles == ()
    assert Decision.of_record({"reports": {}}) is None


def test_a_reserve_appends_a_round_and_takes_over_the_roles():
    data = {"pipeline": "p-rld-md->re-served-p-md", "reason": "re-served after RLD lost",
            "reserve": {"round": 1, "from_position": 7, "lost": "RELAY_DECODE", "t": 12.5},
            "roles": ["MAIN_DECODE", "PREFILL"], "mode": "pdd"}
    d = ROUTED.with_reserve(Reserve.read(data))
    assert d.roles == ("MAIN_DECODE", "PREFILL") and d.pipeline == "p-rld-md"
    assert d.reserves[0].from_position == 7
    assert Decision.read(d.data()).reserves[0].data() == data
    with pytest.raises(ValueError, match=r"reserve\.from_position"):
        Reserve.read(dict(data, reserve={"round": 1, "from_position": -0.5, "lost": "x",
                                         "t": 1}))
