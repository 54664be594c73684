"""``testbed collect``: results copied out of the client pod become a run directory that
``testbed report`` reads; tokens are verified against a single-process greedy decode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.export.build import ExportOptions, build_export
from testbed.export.collect import CollectError, collect
from testbed.export.write import run_metadata, write_export
from testbed.pdd.run.config import parse_config
from testbed.pdd.compute.model import build_model
from testbed.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def export_dir(tmp_path):
    sc = load_scenario(ROOT / "scenarios" / "kill-md-restart.yaml")
    exp = build_export(sc)
    write_export(exp, tmp_path / "exp", run_metadata(sc, ExportOptions()))
    return tmp_path / "exp", exp


def _record(i: int, prompt: list[int], tokens: list[int], t_sent: float) -> dict:
    return {"id": i, "session": i, "mode": "pdd", "pipeline": "p-md", "prompt": prompt,
            "prompt_len": len(prompt), "max_out": len(tokens), "status": "completed",
            "reason": None, "t_sent": t_sent, "ttft_s": 0.1, "e2e_s": 0.5,
            "tokens": [[p, t, 0.1 + 0.01 * p, "main_decode"] for p, t in enumerate(tokens)],
            "tokens_lost": 0, "tokens_duplicated": 0, "arrival_s": 0.0}


def _results(export_dir: Path, exp, alter: bool) -> None:
    mode = exp.modes[0]
    cfg = parse_config(json.loads(dict(mode.files)["10-config.yaml"][0]["data"]["cluster.json"]))
    model = build_model(cfg.model)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5]]
    recs = [_record(i, p, model.greedy_generate(p, 6), 100.0 + i) for i, p in enumerate(prompts)]
    if alter:
        recs[1]["tokens"][2][1] = (recs[1]["tokens"][2][1] + 1) % cfg.model.vocab_size
    res = export_dir / mode.name / "results"
    res.mkdir(parents=True)
    (res / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (res / "client.json").write_text(json.dumps({"t_start_mono": 99.5, "t_end_mono": 130.0,
                                                 "t_start_wall": 1.0}))
    (export_dir / mode.name / "logs").mkdir()
    (export_dir / mode.name / "logs" / "md1.log").write_text("md1 log\n")


def test_collect_makes_a_run_directory_the_report_reads(export_dir, tmp_path):
    d, exp = export_dir
    _results(d, exp, alter=False)
    assert collect(d, tmp_path / "run") == {"pdd": {"checked": 2, "mismatched": []}}
    run = tmp_path / "run"
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["scenario"] == "kill-md-restart" and meta["scale"] == 1.0
    assert meta["modes"] == ["pdd"] and meta["backend"] == "kubernetes+chaos-mesh"
    assert (run / "pdd" / "roles" / "md1.log").read_text() == "md1 log\n"
    assert parse_config(json.loads((run / "pdd" / "cluster.json").read_text())).mode.value \
        == "pdd"
    events = [json.loads(x) for x in (run / "pdd" / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["t_mono"]) for e in events] == [
        ("workload_start", 99.5), ("fault_start", 119.5), ("fault_end", 129.5),
        ("workload_end", 130.0)]  # restart at 20 s for 10 s, as planned
    assert all(e.get("planned") for e in events if e["kind"].startswith("fault"))
    # the runner's vocabulary: the scenario's kind, the cluster action beside it
    assert {(e["fault_kind"], e["action"], e["target"]) for e in events
            if e["kind"].startswith("fault")} == {("restart", "pod-failure", "md1")}
    from testbed.report import build_report

    summary = build_report(run)
    assert summary["modes"]["pdd"]["requests_completed"] == 2
    assert (run / "report.md").is_file()


def test_a_token_that_differs_from_greedy_decode_is_mismatched(export_dir, tmp_path):
    d, exp = export_dir
    _results(d, exp, alter=True)
    assert collect(d, tmp_path / "run") == {"pdd": {"checked": 2, "mismatched": [1]}}


def test_no_results_is_an_error_that_says_where_to_copy_them(export_dir, tmp_path):
    d, _ = export_dir
    with pytest.raises(CollectError, match=r"kubectl cp tb-kill-md-restart-pdd/POD:/results"):
        collect(d, tmp_path / "run")
    with pytest.raises(CollectError, match="export.json: missing"):
        collect(tmp_path / "nothing", tmp_path / "run")


def test_expectations_on_modes_without_results_are_listed_not_checked(tmp_path):
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    exp = build_export(sc)
    write_export(exp, tmp_path / "exp", run_metadata(sc, ExportOptions()))
    _results(tmp_path / "exp", exp, alter=False)
    collect(tmp_path / "exp", tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["modes"] == ["pdd"]
    assert meta["expectations_not_checked"] == [
        "baseline completes too", "pdd cuts the TTFT tail",
        "pdd TTFT no worse than the baseline for the requests it does not relay"]
    from testbed.report import build_report

    summary = build_report(tmp_path / "run")  # the report runs on what is there
    assert [e["name"] for e in summary["expectations"]] == [
        "no token lost", "no token duplicated", "every pdd request completes",
        "some requests are relayed"]
