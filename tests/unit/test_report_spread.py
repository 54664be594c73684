"""testbed/report/spread.py: a scenario's expectations across runs."""

from __future__ import annotations

import json

from testbed.report.spread import bound_value, load_summaries, spread, spread_markdown
from testbed.spec.scenario import load_scenario, with_seed


def summary(p90_ratio, lost=0, fidelity="faithful"):
    return {"passed": p90_ratio <= 0.8 and lost == 0, "fidelity": {"verdict": fidelity},
            "expectations": [
                {"name": "no loss", "passed": lost == 0, "value": lost,
                 "bound": "tokens_lost of pdd == 0"},
                {"name": "tail", "passed": p90_ratio <= 0.8, "value": p90_ratio,
                 "bound": f"ttft_p90_s pdd / cross-dc-pd <= 0.8 ({p90_ratio} / 1)"}]}


def test_a_bound_between_the_smallest_and_largest_value_is_inside_the_spread():
    s = spread([("a", summary(0.54)), ("b", summary(0.62)), ("c", summary(0.83, fidelity="degraded"))])
    loss, tail = s["expectations"]
    assert (loss["inside"], loss["flips"], loss["passed"]) == (False, False, 3)
    assert tail["values"] == [0.54, 0.62, 0.83]
    assert (tail["min"], tail["median"], tail["max"]) == (0.54, 0.62, 0.83)
    assert (tail["inside"], tail["flips"], tail["passed"], tail["runs"]) == (True, True, 2, 3)
    assert s["degraded"] == 1
    md = spread_markdown("x", s)
    assert "| tail | ttft_p90_s pdd / cross-dc-pd <= 0.8 (0.54 / 1) | 0.54, 0.62, 0.83 |" in md
    assert "**yes** (verdict flips)" in md and "1 of 3 runs read degraded" in md


def test_a_spread_clear_of_its_bound_is_not_inside():
    s = spread([("a", summary(0.54)), ("b", summary(0.62))])
    assert not s["expectations"][1]["inside"] and not s["expectations"][1]["flips"]


def test_bound_value_reads_the_number_of_the_bound_text():
    assert bound_value("ttft_p90_s pdd / cross-dc-pd <= 0.8 (1.2 / 2.5)") == 0.8
    assert bound_value("md_imbalance of pdd <= 1.5") == 1.5
    assert bound_value("tokens_lost of pdd == 0") == 0.0
    assert bound_value("no number") is None


def test_load_summaries_labels_each_run_with_its_seed(tmp_path):
    for name, seed in (("r1", 41), ("r2", 42)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary(0.5)))
        (tmp_path / name / "metadata.json").write_text(json.dumps({"seed": seed}))
    runs = load_summaries([tmp_path / "r1", tmp_path / "r2"])
    assert [label for label, _ in runs] == ["r1 (seed 41)", "r2 (seed 42)"]


def test_with_seed_reseeds_the_run_and_every_workload():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sc = load_scenario(root / "scenarios" / "paper" / "fleet.yaml")
    again = with_seed(sc, 99)
    assert again.seed == 99 and again.workload.synthetic.seed == 99
    assert all(m.workload.synthetic.seed == 99 for m in again.modes)
    assert sc.workload.synthetic.seed == 61  # the original is unchanged


def test_a_run_without_a_readable_summary_is_named(tmp_path):
    import pytest

    from testbed.report.rundir import ReportError

    with pytest.raises(ReportError, match=r"nope/summary.json: not readable"):
        load_summaries([tmp_path / "nope"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text("{")
    with pytest.raises(ReportError, match=r"bad/summary.json: not valid JSON"):
        load_summaries([tmp_path / "bad"])
