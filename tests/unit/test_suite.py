"""testbed suite: path collection, the verdict matrix, the loop, outputs, exit codes.

Nothing here builds a network: the loop gets fake run functions that
return canned summary.json objects (docs/run-directory.md), raise, or
raise KeyboardInterrupt.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from testbed import cli
from testbed.errors import EmulationError, SpecError, TestbedError
from testbed.net.apply import Terminated
from testbed.scenario import runner
from testbed.scenario.runner import RunOptions
from testbed.scenario.suite import (SuiteSpecError, collect_paths, expectation_rows,
                                    junit_xml, load_all, run_suite, select, suite_md)

ROOT = Path(__file__).resolve().parents[2]
CANNED = Path(__file__).parent / "fixtures" / "run-canned"
TOPOLOGY = str(ROOT / "topologies" / "two-dc.yaml")
EXPECTATIONS = [
    {"name": "no token lost", "mode": "pdd", "metric": "tokens_lost", "op": "==", "value": 0},
    {"name": "ttft tail cut", "mode": "pdd", "metric": "ttft_p90_s",
     "baseline": "cross-dc-pd", "max_ratio": 0.8}]


def scenario_yaml(directory: Path, name: str, file: str | None = None, **changes) -> Path:
    data = {"name": name, "topology": TOPOLOGY, "modes": ["pdd", "cross-dc-pd"],
            "workload": {"kind": "synthetic", "seed": 1, "n_requests": 4,
                         "arrival": {"process": "poisson", "rate_rps": 1},
                         "input_len": {"dist": "fixed", "tokens": 256},
                         "output_len": {"dist": "fixed", "tokens": 32},
                         "hit_rate": {"mean_pct": 90}},
            "expectations": EXPECTATIONS, **changes}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (file or f"{name}.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def mode(**over) -> dict:
    m = {"requests_total": 4, "requests_completed": 4, "requests_failed": 0,
         "tokens_lost": 0, "tokens_duplicated": 0, "ttft_p50_s": 0.2, "ttft_p90_s": 0.4,
         "ttft_p99_s": 0.5, "tpot_p50_ms": 30.0, "wan_bytes": 123, "rld_token_share": 0.15,
         "relayed_share": 0.25, "emulated": {"wan_bytes": 12}, "requests_verified": 4,
         "requests_mismatched": 0}
    return {**m, **over}


def summary(name: str, ratio_passed: bool = True, passed: bool | None = None,
            pdd: dict | None = None) -> dict:
    exps = [{"name": "no token lost", "passed": True, "value": 0,
             "bound": "tokens_lost of pdd == 0"},
            {"name": "ttft tail cut", "passed": ratio_passed,
             "value": 0.5 if ratio_passed else 1.25,
             "bound": "ttft_p90_s pdd / cross-dc-pd <= 0.8 (0.4 / 0.8)"}]
    modes = {"pdd": mode(**(pdd or {})), "cross-dc-pd": mode(ttft_p90_s=0.8)}
    if passed is None:
        passed = ratio_passed and all(m["tokens_lost"] == 0 and m["tokens_duplicated"] == 0
                                      and not m["requests_mismatched"] for m in modes.values())
    return {"scenario": name, "backend": "userspace", "scale": 25.0, "modes": modes,
            "comparisons": [], "expectations": exps, "passed": passed}


class FakeRun:
    """run_scenario stand-in: per scenario name a summary or an exception;
    advances a fake clock by 30 s per scenario and records what it was given."""

    def __init__(self, outcomes: dict):
        self.outcomes, self.calls, self.now = outcomes, [], 1000.0

    def clock(self) -> float:
        return self.now

    def __call__(self, sc, opts: RunOptions) -> dict:
        self.calls.append((sc.name, opts))
        self.now += 30.0
        outcome = self.outcomes.get(sc.name, "pass")
        if isinstance(outcome, BaseException):
            raise outcome
        return summary(sc.name, ratio_passed=outcome == "pass")


def three(tmp_path: Path) -> list:
    d = tmp_path / "sc"
    for name in ("s1", "s2", "s3"):
        scenario_yaml(d, name)
    return load_all(collect_paths([d]))


# -- paths and validation ------------------------------------------------------
def test_a_directory_gives_its_yaml_files_sorted_and_repeats_are_dropped(tmp_path):
    d = tmp_path / "sc"
    b, a = scenario_yaml(d, "b"), scenario_yaml(d, "a")
    (d / "notes.txt").write_text("not a scenario")
    scenario_yaml(d / "sub", "c")                   # not recursive
    extra = scenario_yaml(tmp_path / "other", "x")
    assert collect_paths([extra, d, a]) == [extra, a, b]
    assert collect_paths([str(b), str(d / "." / "b.yaml")]) == [b]


def test_a_missing_path_or_a_directory_without_yaml_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError) as e:
        collect_paths([tmp_path / "nope.yaml"])
    assert e.value.file == str(tmp_path / "nope.yaml") and "no such file" in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="no \\*.yaml file"):
        collect_paths([tmp_path / "empty"])


def test_every_bad_file_is_named_before_anything_runs(tmp_path):
    d = tmp_path / "sc"
    good = scenario_yaml(d, "good")
    bad_seed = scenario_yaml(d, "bad-seed", seed=-3)
    bad_metric = scenario_yaml(d, "bad-metric", expectations=[
        {"name": "x", "mode": "pdd", "metric": "ttft_p95_s", "op": "<", "value": 1}])
    with pytest.raises(SuiteSpecError) as e:
        load_all([good, bad_seed, bad_metric])
    text = str(e.value)
    assert "2 invalid scenario files" in text
    assert str(bad_seed) in text and "seed" in text and "-3" in text
    assert str(bad_metric) in text and "ttft_p95_s" in text
    with pytest.raises(SpecError) as one:            # a single bad file: its own error
        load_all([good, bad_seed])
    assert not isinstance(one.value, SuiteSpecError) and one.value.file == str(bad_seed)


def test_names_must_be_unique_and_folder_safe(tmp_path):
    a = scenario_yaml(tmp_path, "same", file="a.yaml")
    b = scenario_yaml(tmp_path, "same", file="b.yaml")
    with pytest.raises(SpecError) as e:
        load_all([a, b])
    assert e.value.file == str(b) and e.value.path == "name" and str(a) in str(e.value)
    escape = scenario_yaml(tmp_path, "../up", file="c.yaml")
    with pytest.raises(SpecError, match="folder-safe"):
        load_all([escape])


def test_only_and_skip_select_by_name_and_unknown_names_are_errors(tmp_path):
    scs = three(tmp_path)
    keep, skipped = select(scs, skip=["s2"])
    assert [s.name for s in keep] == ["s1", "s3"] and skipped == ["s2"]
    keep, skipped = select(scs, only=["s3", "s1"])
    assert [s.name for s in keep] == ["s1", "s3"] and skipped == ["s2"]
    with pytest.raises(TestbedError, match="--skip: no scenario named s9"):
        select(scs, skip=["s9"])
    with pytest.raises(TestbedError, match="nothing to run"):
        select(scs, only=["s1"], skip=["s1"])


# -- the matrix ----------------------------------------------------------------
def test_canned_run_expectations_get_mode_and_metric_from_the_spec():
    resolved = json.loads((CANNED / "metadata.json").read_text())["resolved"]
    specs = resolved["expectations"]
    results = [{"name": s["name"], "passed": s["name"] != "handoff-stall-under-200ms",
                "value": 346.0 if s["name"].startswith("handoff") else 0.1, "bound": "b"}
               for s in specs]
    rows = expectation_rows({"expectations": results}, specs)
    by_name = {r["name"]: r for r in rows}
    assert [r["name"] for r in rows] == [s["name"] for s in specs]
    ratio = by_name["pdd-ttft-p90-below-0.6x"]
    assert (ratio["mode"], ratio["baseline"], ratio["metric"]) == \
        ("pdd", "cross-dc-pd", "ttft_p90_s")
    stall = by_name["handoff-stall-under-200ms"]
    assert stall["metric"] == "handoff_stall_p99_ms" and not stall["passed"] \
        and stall["value"] == 346.0
    assert all(r["passed"] for r in rows if r is not stall)


def test_a_failed_expectation_is_the_reason_and_the_matrix_has_every_mode(tmp_path):
    fake = FakeRun({"s2": "fail"})
    suite = run_suite(three(tmp_path), RunOptions(tmp_path / "out"), fake, clock=fake.clock)
    r = suite.results[1]
    assert r.verdict == "failed" and len(r.reasons) == 1
    assert r.reasons[0].startswith("ttft tail cut: 1.25 (ttft_p90_s pdd / cross-dc-pd <= 0.8")
    rows = {(c["mode"], c["name"]): c for c in r.checks}
    assert not rows[("pdd", "ttft tail cut")]["passed"]
    assert rows[("pdd", "ttft tail cut")]["metric"] == "ttft_p90_s"
    assert rows[("cross-dc-pd", "cross-dc-pd: tokens_lost == 0")]["passed"]
    assert {c["kind"] for c in r.checks} == {"expectation", "check"}
    assert set(r.modes) == {"pdd", "cross-dc-pd"}
    assert r.modes["cross-dc-pd"]["ttft_p90_s"] == 0.8
    assert "wan_bytes" not in r.modes["pdd"] and "emulated" not in r.modes["pdd"]
    assert (r.backend, r.scale, r.wall_s) == ("userspace", 25.0, 30.0)
    assert [x.verdict for x in suite.results] == ["passed", "failed", "passed"]
    assert suite.results[0].reasons == [] and suite.exit_code == 1


@pytest.mark.parametrize("pdd, passed, reason", [
    ({"tokens_duplicated": 2}, None, "pdd: tokens_duplicated == 0: 2"),
    ({"requests_mismatched": 1}, None, "pdd: requests_mismatched == 0: 1"),
    ({}, False, "summary.json says passed=false, but every expectation"),
])
def test_passed_false_with_passing_expectations_names_the_runner_check(tmp_path, pdd, passed,
                                                                      reason):
    sc = load_all([scenario_yaml(tmp_path, "tok")])

    def run(sc, opts):
        return summary(sc.name, passed=passed, pdd=pdd)

    r = run_suite(sc, RunOptions(tmp_path / "out"), run).results[0]
    assert r.verdict == "failed" and r.reasons[0].startswith(reason), r.reasons
    root = ET.fromstring(junit_xml(run_suite(sc, RunOptions(tmp_path / "o2"), run)))
    failures = root.findall(".//testcase/failure")
    assert len(failures) == 1 and failures[0].get("message") in r.reasons[0]


# -- the loop ------------------------------------------------------------------
def test_a_crashing_scenario_is_recorded_and_the_suite_goes_on(tmp_path):
    fake = FakeRun({"s2": EmulationError("the WAN does not deliver its RTT: configured 40 ms")})
    base = RunOptions(tmp_path / "out", seed=5, scale=25.0, backend="userspace",
                      ready_timeout_s=900.0, preflight_tol_ms=10.0)
    suite = run_suite(three(tmp_path), base, fake, clock=fake.clock)
    assert [c[0] for c in fake.calls] == ["s1", "s2", "s3"]
    for name, opts in fake.calls:   # every option passed through, out_dir per scenario
        assert opts.out_dir == tmp_path / "out" / name
        assert (opts.seed, opts.scale, opts.backend, opts.ready_timeout_s,
                opts.preflight_tol_ms, opts.dry_run) == (5, 25.0, "userspace", 900.0, 10.0, False)
    crashed = suite.results[1]
    assert crashed.verdict == "failed" and crashed.checks == []
    assert crashed.reasons == \
        ["EmulationError: the WAN does not deliver its RTT: configured 40 ms"]
    assert crashed.error["type"] == "EmulationError" and crashed.error["traceback"] is None
    assert suite.results[2].verdict == "passed" and suite.exit_code == 1
    assert suite.wall_s == 90.0
    data = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert [s["verdict"] for s in data["scenarios"]] == ["passed", "failed", "passed"]
    assert data["counts"] == {"passed": 2, "failed": 1, "interrupted": 0, "not_run": 0}
    assert data["passed"] is False and data["exit_code"] == 1 and data["wall_s"] == 90.0


def test_a_bug_in_a_scenario_keeps_its_traceback(tmp_path):
    fake = FakeRun({"s1": RuntimeError("boom")})
    suite = run_suite(three(tmp_path), RunOptions(tmp_path / "out"), fake)
    r = suite.results[0]
    assert r.reasons == ["RuntimeError: boom"] and "Traceback" in r.error["traceback"]
    assert "RuntimeError: boom" in (tmp_path / "out" / "suite.md").read_text()


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), Terminated("signal 15")])
def test_ctrl_c_marks_the_running_scenario_and_keeps_what_finished(tmp_path, stop):
    seen_on_disk = []

    class Interrupting(FakeRun):
        def __call__(self, sc, opts):
            seen_on_disk.append(json.loads((tmp_path / "out" / "suite.json").read_text()))
            return super().__call__(sc, opts)

    fake = Interrupting({"s2": stop})
    junit = tmp_path / "reports" / "junit.xml"
    suite = run_suite(three(tmp_path), RunOptions(tmp_path / "out"), fake, junit, clock=fake.clock)
    assert [c[0] for c in fake.calls] == ["s1", "s2"]            # s3 never started
    # written before the first scenario and again after it finished
    assert [len(d["scenarios"]) for d in seen_on_disk] == [0, 1]
    assert suite.interrupted and suite.exit_code == 130 and suite.not_run == ["s3"]
    assert [r.verdict for r in suite.results] == ["passed", "interrupted"]
    assert suite.results[1].reasons[0].startswith("interrupted")
    data = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert data["interrupted"] and data["not_run"] == ["s3"] and data["exit_code"] == 130
    assert data["scenarios"][0]["checks"] and data["scenarios"][1]["verdict"] == "interrupted"
    root = ET.parse(junit).getroot()
    s2 = root.find("testsuite[@name='s2']")
    assert s2.find("testcase/error").get("message").startswith("interrupted")
    assert root.find("testsuite[@name='s3']/testcase/skipped") is not None
    md = (tmp_path / "out" / "suite.md").read_text()
    assert "| s2 | interrupted |" in md and "| s3 | not run |" in md


# -- outputs -------------------------------------------------------------------
def test_junit_has_a_suite_per_scenario_failures_and_errors(tmp_path):
    fake = FakeRun({"s2": "fail", "s3": EmulationError("no netem")})
    scs = three(tmp_path)
    suite = run_suite(scs, RunOptions(tmp_path / "out"), fake, skipped=["s0"], clock=fake.clock)
    root = ET.fromstring(junit_xml(suite))
    assert [ts.get("name") for ts in root.findall("testsuite")] == ["s1", "s2", "s3", "s0"]
    s1, s2, s3, s0 = root.findall("testsuite")
    # 2 expectations + 3 token checks x 2 modes
    assert (s1.get("tests"), s1.get("failures"), s1.get("errors")) == ("8", "0", "0")
    assert s1.get("time") == "30.000"
    (fail,) = s2.findall("testcase/failure")
    assert fail.get("type") == "expectation" and "<= 0.8" in fail.get("message")
    assert s2.find("testcase[failure]").get("name") == "ttft tail cut"
    assert s2.get("failures") == "1"
    (err,) = s3.findall("testcase/error")
    assert err.get("type") == "EmulationError" and err.get("message") == \
        "EmulationError: no netem"
    assert s3.get("errors") == "1" and s3.get("tests") == "1"
    assert s0.find("testcase/skipped").get("message") == "left out by --only/--skip"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) \
        == ("18", "1", "1", "1")


def test_markdown_has_the_overview_the_matrix_and_the_mode_metrics(tmp_path):
    fake = FakeRun({"s2": "fail"})
    md = suite_md(run_suite(three(tmp_path), RunOptions(tmp_path / "out"), fake,
                            clock=fake.clock))
    assert "suite: 3 scenarios: 2 passed, 1 failed, 0 interrupted, 0 not run; wall 90.0 s" in md
    assert "| s2 | failed | - | - | 30.0 | ttft tail cut: 1.25 (ttft_p90_s pdd / cross-dc-pd" in md
    assert "| pdd | ttft tail cut | ttft_p90_s | 1.25 |" in md and "| FAIL |" in md
    assert "| metric | pdd | cross-dc-pd |" in md and "| ttft_p90_s | 0.4 | 0.8 |" in md


# -- the command line ----------------------------------------------------------
@pytest.fixture
def fake_runner(monkeypatch):
    def install(outcomes):
        fake = FakeRun(outcomes)
        monkeypatch.setattr(runner, "run_scenario", fake)
        return fake
    return install


def test_cli_exit_codes(tmp_path, fake_runner, capsys):
    d = tmp_path / "sc"
    for name in ("s1", "s2"):
        scenario_yaml(d, name)
    out, junit = tmp_path / "out", tmp_path / "junit.xml"
    args = ["suite", str(d), "--out", str(out), "--junit", str(junit)]
    fake = fake_runner({})
    assert cli.main(args + ["--seed", "9", "--scale", "25", "--backend", "userspace"]) == 0
    assert [(n, o.seed, o.scale, o.backend) for n, o in fake.calls] == \
        [("s1", 9, 25.0, "userspace"), ("s2", 9, 25.0, "userspace")]
    assert ET.parse(junit).getroot().get("failures") == "0"
    fake_runner({"s2": "fail"})
    assert cli.main(args) == 1
    assert json.loads((out / "suite.json").read_text())["counts"]["failed"] == 1
    fake_runner({"s1": EmulationError("x")})
    assert cli.main(args + ["--skip", "s2"]) == 1
    fake = fake_runner({"s1": KeyboardInterrupt()})
    assert cli.main(args) == 130 and "interrupted" in capsys.readouterr().err
    fake = fake_runner({})
    assert cli.main(["suite", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert cli.main(args + ["--only", "s9"]) == 2
    scenario_yaml(d, "s3", seed=-1)
    assert cli.main(args) == 2 and fake.calls == []          # nothing ran
    err = capsys.readouterr().err
    assert "s3.yaml: seed" in err and "-1" in err


def test_a_sigterm_whose_exception_was_swallowed_is_raised_by_the_runner_loop():
    """The handler raises Terminated; if a library's event loop catches it, the runner's
    tick calls raise_if_terminated and the run still stops (once)."""
    import os

    from testbed.net import apply

    handler = apply._terminate_handler(os.getpid())
    try:
        handler(15, None)
    except apply.Terminated:
        pass  # e.g. caught and logged by pyroute2's asyncio loop
    with pytest.raises(apply.Terminated, match="signal 15"):
        apply.raise_if_terminated()
    apply.raise_if_terminated()  # raised once: nothing pending any more


def test_a_degraded_fidelity_fails_only_a_strict_scenario_and_shows_in_the_matrix(tmp_path):
    from testbed.scenario.suite import finished

    degraded = {"verdict": "degraded", "policy": "report",
                "reasons": ["pdd: compute: md1 event loop lag p99 21.2 ms > 5 ms"]}
    sc = three(tmp_path)[0]
    base = summary(sc.name, ratio_passed=True)
    reported = finished(sc, tmp_path / "o", {**base, "fidelity": degraded}, 30.0)
    assert reported.verdict == "passed"
    assert [c["value"] for c in reported.checks if c["kind"] == "fidelity"] == ["degraded"]
    strict = finished(sc, tmp_path / "o", {**base, "fidelity": {**degraded, "policy": "strict"}},
                      30.0)
    assert strict.verdict == "failed"
    assert strict.reasons == ["fidelity degraded (strict): pdd: compute: md1 event loop lag "
                              "p99 21.2 ms > 5 ms"]
    from testbed.scenario.suite import Suite

    suite = Suite(tmp_path, [sc.name], results=[strict])
    assert f"| {sc.name} | failed | degraded | - | 30.0 |" in suite_md(suite)
    xml = junit_xml(suite)
    assert '<testcase classname="s1" name="fidelity">' in xml
    assert '<failure type="fidelity" message="degraded (faithful (fidelity: strict))"' in xml
    assert "md1 event loop lag" in xml


def test_the_hypervisors_steal_shows_beside_a_degraded_verdict(tmp_path):
    from testbed.scenario.suite import Suite, finished

    degraded = {"verdict": "degraded", "policy": "report",
                "reasons": ["pdd: network: delay line wan/a>b lateness p99 1.58 ms > 1 ms"],
                "host_steal": {"share": 0.0442, "mode": "pdd", "worst_share": 0.21}}
    sc = three(tmp_path)[0]
    r = finished(sc, tmp_path / "o", {**summary(sc.name), "fidelity": degraded}, 30.0)
    md = suite_md(Suite(tmp_path, [sc.name], results=[r]))
    assert f"| {sc.name} | passed | degraded | 4.4% (worst 21%) | 30.0 |" in md
    assert "- note: host: the hypervisor took 4.4% of the cores' time in pdd" in md


def test_suite_seeds_judges_each_expectation_over_the_seeds(tmp_path, monkeypatch):
    """--seeds 3: each scenario on seeds S, S+1, S+2 into NAME/seed-K, judged on the
    median (the scenario's default): one failing seed of three passes, a token lost on
    any seed fails; NAME/seeds.md is written; the matrix shows the interval."""
    d = tmp_path / "sc"
    for name in ("s1", "s2"):
        scenario_yaml(d, name, seed=5)
    ratio = {5: 0.5, 6: 0.9, 7: 0.6}   # the pdd p90 against the baseline's 0.8

    def fake(sc, opts):
        r = ratio[opts.seed]
        lost = 3 if sc.name == "s2" and opts.seed == 7 else 0
        s = summary(sc.name, ratio_passed=r <= 0.8, pdd={"ttft_p90_s": 0.8 * r,
                                                         "tokens_lost": lost})
        s["expectations"][1]["value"] = r
        calls.append((sc.name, opts.seed, opts.out_dir.name, sc.seed))
        return s
    calls: list = []
    monkeypatch.setattr(runner, "run_scenario", fake)
    out = tmp_path / "out"
    assert cli.main(["suite", str(d), "--out", str(out), "--seeds", "3"]) == 1
    assert calls[:3] == [("s1", 5, "seed-5", 5), ("s1", 6, "seed-6", 6), ("s1", 7, "seed-7", 7)]
    doc = json.loads((out / "suite.json").read_text())
    s1, s2 = doc["scenarios"]
    assert (s1["verdict"], s1["seeds"], s2["verdict"]) == ("passed", 3, "failed")
    row = next(c for c in s1["checks"] if c["name"] == "ttft tail cut")
    assert row["value"] == pytest.approx(0.6) and row["passed"]
    assert "over 3 seeds, on the median (95% CI [" in row["bound"] and "2/3 runs" in row["bound"]
    assert any("tokens_lost" in why for why in s2["reasons"])
    assert (out / "s1" / "seeds.md").is_file() and "seeds.md" in (out / "suite.md").read_text()
    assert cli.main(["suite", str(d), "--out", str(tmp_path / "o2"), "--seeds", "0"]) == 2
