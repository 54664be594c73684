"""The metric catalogue (testbed/catalog.py): one list that the scenario reader, the
report and the docs agree with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from testbed.catalog import BOUNDABLE, METRICS, MODE_FIGURES, PAIRED, by_name
from testbed.report import metrics as report_metrics
from testbed.spec import scenario as spec_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_every_metric_is_named_once_with_a_unit_and_a_line_of_meaning():
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    assert all(m.unit and len(m.doc) > 10 for m in METRICS)
    assert set(PAIRED) == {"paired_ttft_ratio_p50"} and not set(PAIRED) & set(BOUNDABLE)
    with pytest.raises(KeyError, match="'ttft_p95_s' is not a metric .*ttft_p90_s"):
        by_name("ttft_p95_s")


def test_the_reader_and_the_report_take_their_names_from_it():
    assert spec_scenario.METRICS == report_metrics.MODE_METRICS == BOUNDABLE
    assert spec_scenario.PAIRED_METRICS == report_metrics.PAIRED_METRICS == PAIRED
    assert report_metrics.MODE_KEYS[:len(MODE_FIGURES)] == MODE_FIGURES


def test_the_run_directory_contract_names_every_metric():
    text = (ROOT / "docs" / "run-directory.md").read_text()
    missing = [m.name for m in METRICS
               if not re.search(r"[\"`]" + re.escape(m.name.split(".")[-1]) + r"[\"`]", text)]
    assert not missing, f"docs/run-directory.md does not name {missing}"


@pytest.mark.parametrize("metric", ["ttft_high_hit_p50_s", "emulated.wan_bytes"])
def test_a_metric_the_report_computes_is_one_a_scenario_may_bound(tmp_path, metric):
    """The reader once refused two names the report evaluates: now both accept them."""
    data = {"name": "s", "topology": str(ROOT / "topologies" / "two-dc.yaml"),
            "modes": ["pdd", "cross-dc-pd"],
            "workload": {"kind": "synthetic", "seed": 1, "n_requests": 4,
                         "arrival": {"process": "poisson", "rate_rps": 1},
                         "input_len": {"dist": "fixed", "tokens": 256},
                         "output_len": {"dist": "fixed", "tokens": 32},
                         "hit_rate": {"mean_pct": 90}},
            "expectations": [{"name": "x", "mode": "pdd", "metric": metric,
                              "baseline": "cross-dc-pd", "max_ratio": 1.1}]}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    sc = spec_scenario.load_scenario(path)
    assert sc.expectations[0].metric == metric
    m = {"ttft_high_hit_p50_s": 0.5, "emulated": {"wan_bytes": 12}}
    assert report_metrics.metric_value(m, metric) == (0.5 if metric.startswith("ttft") else 12)
