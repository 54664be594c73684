"""testbed/report/balance.py: work per instance from request records."""

from __future__ import annotations

import dataclasses

import pytest

from testbed.decision import Routing
from testbed.report.balance import balance, imbalance, instance_roles
from testbed.report.metrics import mode_metrics, named_instances
from testbed.types import Sla

INSTANCES = {"p1": "PREFILL", "p2": "PREFILL", "md1": "MAIN_DECODE", "md2": "MAIN_DECODE",
             "md3": "MAIN_DECODE", "rld1": "RELAY_DECODE"}


def rec(rid, t_route, p, md, *, prefill=(0.5, 1.0), queue_s=0.0, tokens=((0.2, "MD"),),
        rld=None, e2e=None):
    """A record routed at t_route (= t_sent) to ``p`` and ``md``: P prefilled over
    ``prefill`` (start, end; seconds after t_route), tokens at t_route + t."""
    instances = {"PREFILL": p, "MAIN_DECODE": md}
    if rld:
        instances["RELAY_DECODE"] = rld
    routing = Routing(**{f.name: {"float": 0.0, "int": 0, "str": "pdd"}[f.type]
                         for f in dataclasses.fields(Routing)})
    routing = dataclasses.replace(routing, t_route=t_route).data()
    toks = [[i, 7, t, who] for i, (t, who) in enumerate(tokens)]
    last = max((t for t, _ in tokens), default=0.0)
    return {"id": rid, "status": "completed", "t_sent": t_route, "ttft_s": tokens[0][0],
            "e2e_s": e2e if e2e is not None else last, "tokens": toks,
            "reports": {"router": {"pipeline": "p-md", "reason": "x", "roles": [], "mode": "pdd",
                                   "instances": instances, **routing},
                        "P": {"t_prefill_end": t_route + prefill[1],
                              "prefill_modeled_s": prefill[1] - prefill[0],
                              "queue_s": queue_s}}}


def by_name(b):
    return {r["name"]: r for r in b["instances"]}


def test_every_instance_has_a_row_and_one_that_served_nothing_counts_in_the_mean():
    records = [rec(0, 10.0, "p1", "md1"), rec(1, 11.0, "p1", "md1"), rec(2, 12.0, "p2", "md2")]
    b = balance(records, INSTANCES, (10.0, 20.0))
    rows = by_name(b)
    assert [r["name"] for r in b["instances"]] == ["p1", "p2", "rld1", "md1", "md2", "md3"]
    assert (rows["md1"]["requests"], rows["md2"]["requests"], rows["md3"]["requests"]) == (2, 1, 0)
    assert rows["md1"]["tokens"] == 2 and rows["p1"]["tokens"] == 0
    assert b["imbalance"]["MAIN_DECODE"] == pytest.approx(2 / (3 / 3))
    assert b["imbalance"]["PREFILL"] == pytest.approx(2 / 1.5, abs=1e-4)
    assert b["imbalance"]["RELAY_DECODE"] is None  # one instance


def test_busy_share_is_the_union_of_working_intervals_within_the_window():
    # P1 prefills 10.5-11.0 and 11.0-12.0 (overlapping nothing), 12.2-12.4 for the third
    records = [rec(0, 10.0, "p1", "md1", prefill=(0.5, 1.0), tokens=((1.5, "MD"), (3.0, "MD"))),
               rec(1, 10.5, "p1", "md1", prefill=(0.5, 1.5), tokens=((2.0, "MD"), (2.5, "MD"))),
               rec(2, 12.0, "p1", "md2", prefill=(0.2, 0.4), tokens=((0.5, "MD"), (9.0, "MD")))]
    rows = by_name(balance(records, INSTANCES, (10.0, 20.0)))
    assert rows["p1"]["busy_share"] == pytest.approx((0.5 + 1.0 + 0.2) / 10)
    # md1 decodes 11.5-13.0 and 12.5-13.0: 1.5 s; md2 12.5-20 (its last token, 21.0, is
    # after the window)
    assert rows["md1"]["busy_share"] == pytest.approx(0.15)
    assert rows["md2"]["busy_share"] == pytest.approx(0.75)
    assert rows["md3"]["busy_share"] == 0.0


def test_peak_queue_counts_waiting_requests_at_p_and_held_ones_at_a_decoder():
    records = [rec(i, 10.0 + 0.1 * i, "p1", "md1", prefill=(1.0, 1.2), queue_s=0.9,
                   tokens=((2.0, "MD"), (4.0, "MD"))) for i in range(3)]
    records.append(rec(3, 30.0, "p1", "md1", queue_s=0.0))
    rows = by_name(balance(records, INSTANCES, (10.0, 40.0)))
    assert rows["p1"]["peak_queue"] == 3  # routed within 0.2 s, each waited 0.9 s
    assert rows["md1"]["peak_queue"] == 3
    assert rows["md2"]["peak_queue"] == 0


def test_rld_tokens_count_for_the_rld_instance():
    r = rec(0, 10.0, "p1", "md1", rld="rld1", tokens=((0.3, "RLD"), (0.4, "RLD"), (0.9, "MD")))
    rows = by_name(balance([r], INSTANCES, (10.0, 11.0)))
    assert (rows["rld1"]["tokens"], rows["md1"]["tokens"]) == (2, 1)
    assert rows["rld1"]["busy_share"] == pytest.approx(0.1)


def test_imbalance():
    assert imbalance([5, 5, 5]) == 1.0
    assert imbalance([9, 0, 0]) == 3.0
    assert imbalance([3]) is None and imbalance([0, 0]) is None


def test_instance_roles_reads_cluster_json_and_the_records_name_theirs():
    cluster = {"instances": [{"name": "p1", "role": "prefill"}, {"name": "r", "role": "router"},
                             {"name": "c", "role": "client"}, {"name": "md9", "role": "main_decode"},
                             {"name": "rld1", "role": "relay_decode"}]}
    assert instance_roles(cluster) == {"p1": "PREFILL", "md9": "MAIN_DECODE",
                                       "rld1": "RELAY_DECODE"}
    assert named_instances([rec(0, 1.0, "p1", "md2")]) == {"p1": "PREFILL", "md2": "MAIN_DECODE"}


def test_mode_metrics_carry_the_imbalance_a_scenario_may_bound():
    records = [rec(i, 10.0 + i, "p1" if i % 2 else "p2", "md1" if i < 4 else "md2")
               for i in range(6)]
    m = mode_metrics(records, [], Sla(), 1.0, instances=INSTANCES)
    assert m["md_imbalance"] == pytest.approx(4 / 2)
    assert m["p_imbalance"] == pytest.approx(1.0)
    assert m["balance"]["imbalance"]["MAIN_DECODE"] == m["md_imbalance"]
    # without the cluster's list only the named instances count: md3 is not seen
    assert mode_metrics(records, [], Sla(), 1.0)["md_imbalance"] == pytest.approx(4 / 3, abs=1e-4)
