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


def test_the_placement_candidates_round_trip_and_a_bad_one_is_refused_by_name():
    placed = dataclasses.replace(ROUTED, placement={
        "MAIN_DECODE": {"md0": {"active": 2, "held_tokens": 16, "transfer_s": 0.1,
                                "decode_s": 3.9},
                        "md1": {"active": 0, "held_tokens": 0, "transfer_s": 0.13,
                                "decode_s": 3.85}}})
    again = Decision.read(placed.data())
    assert again.placement["MAIN_DECODE"]["md1"]["decode_s"] == 3.85
    assert Decision.read(ROUTED.data()).placement == {}  # records made before it: none
    bad = dict(placed.data(), placement={"MAIN_DECODE": {"md0": {"active": "two"}}})
    with pytest.raises(ValueError, match=r"decision\.placement\.MAIN_DECODE\.md0\.active"):
        Decision.read(bad)
    with pytest.raises(ValueError, match=r"decision\.placement: expected an object"):
        Decision.read(dict(placed.data(), placement=[1]))


def test_a_late_bound_decision_keeps_its_arrival_and_a_bad_one_is_refused_by_name():
    late = dataclasses.replace(ROUTED, t_arrival=12.5)
    assert Decision.read(late.data()).t_arrival == 12.5
    assert Decision.read(ROUTED.data()).t_arrival is None  # decided on arrival
    with pytest.raises(ValueError, match=r"decision\.t_arrival: expected"):
        Decision.read(dict(late.data(), t_arrival="soon"))


def test_the_router_records_the_candidates_it_placed_among():
    from testbed.pdd.policy import Candidates, DecoderCandidate, PCandidate
    from testbed.pdd.roles.router import placement_record

    c = Candidates(100, [PCandidate("p1", 12.5, 16), PCandidate("p2", 11.0, 0)],
                   [DecoderCandidate("rld1", 1, 0, 0.0, 2.0)],
                   [DecoderCandidate("md1", 2, 16, 0.1, 3.9),
                    DecoderCandidate("md2", 0, 0, 0.13, 3.85, 0.39)], 300)
    rec = placement_record(c, now=10.0)
    assert rec["PREFILL"] == {"p1": {"prefill_end_s": 2.5, "hit_tokens": 16},
                              "p2": {"prefill_end_s": 1.0, "hit_tokens": 0}}
    assert "RELAY_DECODE" not in rec  # one instance: no choice to record
    assert rec["MAIN_DECODE"]["md1"] == {"active": 2, "held_tokens": 16, "transfer_s": 0.1,
                                         "decode_s": 3.9, "delays_s": 0.0}
    assert rec["MAIN_DECODE"]["md2"]["delays_s"] == 0.39
