"""Several seeds of one scenario (testbed/report/seeds.py): spread and 95% intervals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from testbed.report.seeds import describe, seeds_markdown, seeds_table, t_975


def _summary(pdd: float, base: float, lost: int = 0) -> dict:
    return {"modes": {"pdd": {"ttft_p90_s": pdd, "tokens_lost": lost},
                      "cross-dc-pd": {"ttft_p90_s": base, "tokens_lost": 0}},
            "comparisons": [{"metric": "ttft_p90_s", "mode": "pdd", "baseline": "cross-dc-pd"}],
            "expectations": [
                {"name": "tail", "passed": pdd / base <= 0.8, "value": pdd / base,
                 "bound": f"ttft_p90_s pdd / cross-dc-pd <= 0.8 ({pdd:.4g} / {base:.4g})"},
                {"name": "no token lost", "passed": lost == 0, "value": lost,
                 "bound": "tokens_lost of pdd == 0"}],
            "fidelity": {"verdict": None}, "clock": "virtual"}


def test_the_interval_is_students_t_of_the_mean():
    d = describe([1.0, 2.0, 3.0, 4.0])
    half = 3.182 * math.sqrt(5 / 3) / 2  # t(0.975, 3) * s / sqrt(n), s^2 = 5/3
    assert d["mean"] == 2.5 and d["median"] == 2.5
    assert d["ci95"] == pytest.approx((2.5 - half, 2.5 + half))
    assert describe([7.0])["ci95"] is None
    assert t_975(1) == 12.706 and t_975(100) == 1.96
    with pytest.raises(ValueError):
        t_975(0)


def test_ratios_are_per_seed_and_a_bound_inside_the_interval_is_flagged():
    runs = [("seed 1", _summary(1.0, 2.0)), ("seed 2", _summary(1.4, 2.0)),
            ("seed 3", _summary(2.0, 2.0))]
    t = seeds_table(runs)
    assert t["baseline"] == "cross-dc-pd"
    r = t["ratios"]["pdd"]["ttft_p90_s"]
    assert r["values"] == [0.5, 0.7, 1.0]
    tail = t["expectations"]["tail"]
    assert tail["passed"] == 2 and tail["runs"] == 3 and tail["bound_value"] == 0.8
    assert tail["bound"] == "ttft_p90_s pdd / cross-dc-pd <= 0.8"
    assert tail["bound_inside_ci"] is True  # 0.8 within the interval: not settled
    assert t["expectations"]["no token lost"]["bound_inside_ci"] is None
    clear = seeds_table([(f"s{i}", _summary(v, 2.0)) for i, v in enumerate((1.0, 1.02, 0.98))])
    assert clear["expectations"]["tail"]["bound_inside_ci"] is False
    text = seeds_markdown("x", t)
    assert "| tail | ttft_p90_s pdd / cross-dc-pd <= 0.8 | 2/3 |" in text


def test_judged_on_the_median_or_the_intervals_conservative_end():
    from testbed.report.seeds import judge

    values = [0.5, 0.7, 0.9]  # median 0.7; the interval's upper end is far above 0.8
    ci = describe(values)["ci95"]
    assert judge(values, ci, "x <= 0.8", "median") is True
    assert judge(values, ci, "x <= 0.8", "interval") is False
    assert judge(values, ci, "x >= 0.3", "interval") is False  # lower end below 0.3
    assert judge(values, ci, "x > 0.1", "interval") is True
    assert judge([0, 0], (0, 0), "tokens_lost == 0") is True
    assert judge([0, 1], (0, 1), "tokens_lost == 0") is False
    assert judge([], None, "x <= 1") is None and judge([1.0], None, "x <= 1", "interval") is None
    t = seeds_table([(f"s{i}", _summary(v, 2.0)) for i, v in enumerate((1.0, 1.4, 1.8))],
                    judged_on={"tail": "interval"})
    assert t["expectations"]["tail"]["judged_on"] == "interval"
    assert t["expectations"]["tail"]["passed_over_seeds"] is False
    assert t["expectations"]["no token lost"]["passed_over_seeds"] is True


def test_a_scenario_says_how_an_expectation_is_judged_over_seeds(tmp_path):
    from testbed.errors import SpecError
    from testbed.spec.scenario import load_scenario

    root = Path(__file__).resolve().parents[2]
    text = (root / "scenarios" / "quickstart.yaml").read_text().replace(
        "../topologies/two-dc.yaml", str(root / "topologies" / "two-dc.yaml"))
    marked = text.replace("max_ratio: 0.8}", "max_ratio: 0.8, judged_on: interval}")
    assert marked != text
    (tmp_path / "a.yaml").write_text(marked)
    exps = {e.name: e for e in load_scenario(tmp_path / "a.yaml").expectations}
    assert exps["pdd cuts the TTFT tail"].judged_on == "interval"
    assert exps["no token lost"].judged_on is None
    assert "judged_on" not in exps["no token lost"].as_dict()
    (tmp_path / "b.yaml").write_text(text.replace("max_ratio: 0.8}",
                                                  "max_ratio: 0.8, judged_on: mean}"))
    with pytest.raises(SpecError, match="judged_on"):
        load_scenario(tmp_path / "b.yaml")
