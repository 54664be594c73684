"""The fault timeline's translation to Chaos Mesh steps (testbed.export.timeline), and
the Chaos Mesh notation of its values (testbed.export.units): pure functions."""

from __future__ import annotations

import pytest

from testbed.errors import PlanError
from testbed.export import units
from testbed.export.chaos import ChaosContext, workflow
from testbed.export.timeline import Direction, Step, translate
from testbed.spec.faults import FaultSpec
from testbed.impairment import LinkSpec, LossSpec
from testbed.spec.topology import WanSpec

WAN = WanSpec("10.0.0.0/29", LinkSpec(10.0, 20.0), LinkSpec(10.0, 20.0))
NOMINAL = Direction(10.0, 20.0, 0.0, 0.0)
ROLES = {"main_decode": ["md1", "md2"], "relay_decode": ["rld1"], "prefill": ["p1"]}


def fault(i, at, kind, duration=None, **params) -> FaultSpec:
    return FaultSpec(i, at, kind, "wan", duration, params)


def shape(tl):
    return [(s.start_s, s.end_s, s.a_to_b, s.b_to_a) for s in tl.wan]


def test_no_fault_is_one_nominal_segment_to_the_horizon():
    tl = translate((), WAN, ROLES, 100.0)
    assert shape(tl) == [(0.0, 100.0, NOMINAL, NOMINAL)] and tl.steps == () and tl.notes == ()


def test_bandwidth_step_sets_both_directions_and_restores_the_nominal_rate():
    tl = translate((fault(0, 10, "bandwidth", 5, rate_gbit=1.5),), WAN, ROLES, 60.0)
    low = Direction(1.5, 20.0, 0.0, 0.0)
    assert shape(tl) == [(0.0, 10.0, NOMINAL, NOMINAL), (10.0, 15.0, low, low),
                         (15.0, 60.0, NOMINAL, NOMINAL)]


def test_bandwidth_without_duration_lasts_to_the_horizon():
    tl = translate((fault(0, 10, "bandwidth", rate_gbit=2.0),), WAN, ROLES, 60.0)
    assert [(s.start_s, s.end_s, s.a_to_b.rate_gbit) for s in tl.wan] == [
        (0.0, 10.0, 10.0), (10.0, 60.0, 2.0)]


def test_schedule_steps_are_offsets_from_at_s_and_equal_neighbours_merge():
    f = fault(0, 5, "bandwidth_schedule", schedule=[(0, 10.0), (10, 1.0), (20, 1.0), (30, 4.0)])
    tl = translate((f,), WAN, ROLES, 100.0)
    assert [(s.start_s, s.end_s, s.a_to_b.rate_gbit) for s in tl.wan] == [
        (0.0, 15.0, 10.0), (15.0, 35.0, 1.0), (35.0, 100.0, 4.0)]


def test_states_shorter_than_a_millisecond_are_skipped():
    f = fault(0, 0, "bandwidth_schedule",
              schedule=[(1.0, 2.0), (1.0004, 3.0), (5.0, 4.0), (5.0002, 10.0), (9.9995, 1.0)])
    tl = translate((f,), WAN, ROLES, 10.0)
    assert [(s.start_s, s.end_s, s.a_to_b.rate_gbit) for s in tl.wan] == [
        (0.0, 1.0, 10.0), (1.0, 5.0, 3.0), (5.0, 10.0, 10.0)]
    blip = fault(0, 0, "bandwidth_schedule", schedule=[(1.0, 2.0), (1.0004, 10.0), (5.0, 4.0)])
    assert [(s.start_s, s.end_s, s.a_to_b.rate_gbit) for s in
            translate((blip,), WAN, ROLES, 10.0).wan] == [(0.0, 5.0, 10.0), (5.0, 10.0, 4.0)]


def test_rtt_sets_one_way_delay_and_jitter_then_restores_them():
    tl = translate((fault(0, 2, "rtt", 3, one_way_delay_ms=50.0, jitter_ms=1.0),), WAN, ROLES, 10.0)
    high = Direction(10.0, 50.0, 1.0, 0.0)
    assert shape(tl) == [(0.0, 2.0, NOMINAL, NOMINAL), (2.0, 5.0, high, high),
                         (5.0, 10.0, NOMINAL, NOMINAL)]
    assert any("jitter" in n for n in tl.notes)


def test_gilbert_elliott_loss_becomes_its_mean_with_a_note():
    ge = LossSpec("gilbert_elliott", p_pct=5, r_pct=30, bad_loss_pct=50)
    tl = translate((fault(0, 1, "loss", 2, loss=ge),), WAN, ROLES, 10.0)
    assert tl.wan[1].a_to_b.loss_pct == pytest.approx(ge.mean_pct) == pytest.approx(50 * 5 / 35)
    assert tl.wan[2].a_to_b.loss_pct == 0.0
    assert any("Gilbert-Elliott" in n for n in tl.notes)


def test_same_time_actions_keep_the_runners_order_end_before_the_next_start():
    faults = (fault(0, 5, "loss", 20, loss=LossSpec("random", pct=10)),
              fault(1, 25, "loss", 20, loss=LossSpec("random", pct=3)))
    tl = translate(faults, WAN, ROLES, 60.0)
    assert [(s.start_s, s.a_to_b.loss_pct) for s in tl.wan] == [(0.0, 0.0), (5.0, 10.0),
                                                                 (25.0, 3.0), (45.0, 0.0)]


def test_a_later_fault_overrides_an_earlier_one_until_its_own_end():
    faults = (fault(0, 0, "bandwidth", 30, rate_gbit=5.0),
              fault(1, 10, "bandwidth", 5, rate_gbit=1.0))
    tl = translate(faults, WAN, ROLES, 40.0)
    # fault 1's end restores the nominal rate, as the runner's set_link(original) does
    assert [(s.start_s, s.a_to_b.rate_gbit) for s in tl.wan] == [
        (0.0, 5.0), (10.0, 1.0), (15.0, 10.0)]


def test_asymmetric_wan_keeps_each_directions_nominal():
    wan = WanSpec("10.0.0.0/29", LinkSpec(10.0, 20.0), LinkSpec(5.0, 30.0))
    tl = translate((fault(0, 1, "bandwidth", 1, rate_gbit=1.0),), wan, ROLES, 5.0)
    assert [(s.a_to_b.rate_gbit, s.b_to_a.rate_gbit) for s in tl.wan] == [
        (10.0, 5.0), (1.0, 1.0), (10.0, 5.0)]
    assert not any(s.symmetric for s in tl.wan)  # the delays differ throughout


@pytest.mark.parametrize("kind, params, duration, want", [
    ("link_flap", {}, 3.0, Step(10.0, 3.0, "partition", "wan", 0, "link_flap")),
    ("kill", {"role": "relay_decode", "instance": None}, None,
     Step(10.0, 90.0, "pod-failure", "rld1", 0, "kill")),
    ("restart", {"role": "main_decode", "instance": "md2"}, 10.0,
     Step(10.0, 10.0, "pod-failure", "md2", 0, "restart")),
    ("restart", {"role": "main_decode", "instance": None}, 10.0,
     Step(10.0, 10.0, "pod-failure", "md1", 0, "restart")),
    ("congestion", {"flows": 3, "direction": "b>a"}, 40.0,
     Step(10.0, 40.0, "cross-traffic", "b>a", 0, "congestion", 3)),
    ("congestion", {"flows": 2, "direction": "a>b"}, 95.0,   # cut at the horizon
     Step(10.0, 90.0, "cross-traffic", "a>b", 0, "congestion", 2)),
])
def test_each_step_kind(kind, params, duration, want):
    tl = translate((fault(0, 10, kind, duration, **params),), WAN, ROLES, 100.0)
    assert tl.steps == (want,) and len(tl.wan) == 1


def test_steps_are_ordered_by_time_then_fault_and_late_faults_are_dropped():
    faults = (fault(0, 30, "link_flap", 1), fault(1, 10, "link_flap", 1),
              fault(2, 10, "kill", role="prefill", instance=None),
              fault(3, 120, "link_flap", 1))
    tl = translate(faults, WAN, ROLES, 100.0)
    assert [(s.at_s, s.fault_index) for s in tl.steps] == [(10, 1), (10, 2), (30, 0)]
    assert any("fault 3" in n and "dropped" in n for n in tl.notes)
    tiny = translate((fault(0, 99.9995, "link_flap", 1),), WAN, ROLES, 100.0)
    assert tiny.steps == () and "dropped" in tiny.notes[0]


@pytest.mark.parametrize("f, match", [
    (fault(0, 1, "kill", role="main_decode", instance="md9"), "no main_decode instance 'md9'"),
    (FaultSpec(0, 1, "bandwidth", "host:p1", None, {"rate_gbit": 1.0}), "only the WAN"),
])
def test_untranslatable_faults_are_plan_errors(f, match):
    with pytest.raises(PlanError, match=match):
        translate((f,), WAN, ROLES, 100.0)


def test_workflow_orders_wait_then_timeline_and_offsets_by_settle():
    faults = (fault(0, 20, "restart", 10, role="main_decode", instance=None),
              fault(1, 5, "bandwidth", 5, rate_gbit=1.0))
    tl = translate(faults, WAN, ROLES, 50.0)
    ctx = ChaosContext("ns", "a", "b", "http://client:8080", {}, settle_s=5.0)
    t = {x["name"]: x for x in workflow(ctx, tl, "timeline")["spec"]["templates"]}
    assert t["run"]["children"] == ["wait-ready", "timeline"]
    assert t["timeline"]["children"] == ["wan", "start", "f0"]
    assert t["start"]["children"] == ["settle", "start-client"]
    assert t["settle"]["deadline"] == "5s"
    # the WAN chain covers settle + every segment: 5+5, 5, 40 s
    assert [t[c]["deadline"] for c in t["wan"]["children"]] == ["10s", "5s", "40s"]
    assert t["wan-1"]["networkChaos"]["rate"] == {"rate": "1gbit"}
    assert t["f0-wait"]["deadline"] == "25s"                    # settle + at_s
    assert t["f0-pod-failure"]["deadline"] == "10s"
    assert t["f0-pod-failure"]["podChaos"]["selector"]["labelSelectors"] == {
        "pdd-testbed/instance": "md1"}


def test_an_asymmetric_segment_is_two_one_way_netem_objects():
    wan = WanSpec("10.0.0.0/29", LinkSpec(10.0, 20.0, loss=LossSpec("random", pct=1)),
                  LinkSpec(5.0, 0.5))
    ctx = ChaosContext("ns", "a", "b", "http://c:8080", {})
    t = {x["name"]: x for x in workflow(ctx, translate((), wan, ROLES, 9.0), "w")["spec"]
         ["templates"]}
    assert t["wan-0"]["templateType"] == "Parallel"
    ab, ba = t["wan-0-ab"]["networkChaos"], t["wan-0-ba"]["networkChaos"]
    assert (ab["direction"], ab["selector"]["labelSelectors"]) == ("to", {"pdd-testbed/dc": "a"})
    assert (ba["direction"], ba["selector"]["labelSelectors"]) == ("to", {"pdd-testbed/dc": "b"})
    assert ab["delay"]["latency"] == "20ms" and ab["loss"]["loss"] == "1"
    assert ba["delay"]["latency"] == "500us" and "loss" not in ba and ba["rate"]["rate"] == "5gbit"


@pytest.mark.parametrize("gbit, text", [(10, "10gbit"), (1.5, "1500mbit"), (0.7, "700mbit"),
                                        (0.0015, "1500kbit"), (3e-9, "3bit"),
                                        (100, "100gbit")])
def test_rates_are_integers_in_bit_units(gbit, text):
    assert units.rate_string(gbit) == text


@pytest.mark.parametrize("ms, text", [(20, "20ms"), (0.5, "500us"), (0.005, "5us"),
                                      (1.25, "1250us"), (0, "0ms")])
def test_delays_never_start_with_zero_point(ms, text):
    assert units.delay_string(ms) == text


@pytest.mark.parametrize("s, text", [(5, "5s"), (12.5, "12.5s"), (0.25, "0.25s"),
                                     (161.5743, "161.574s")])
def test_go_durations(s, text):
    assert units.seconds_string(s) == text


def test_percentages():
    assert (units.pct_string(10.0), units.pct_string(0.25)) == ("10", "0.25")
    with pytest.raises(ValueError):
        units.seconds_string(0.0001)
