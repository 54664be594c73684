"""build_report on the canned run directory (tests/unit/fixtures/run-canned):
summary.json matches the contract keys exactly, report.md holds the tables
and expectation lines, the PNGs are written, re-running is idempotent, and
missing data gives notes instead of crashes."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from testbed.report import build_report
from testbed.report.expectations import ExpectationError
from testbed.report.plots import DEFAULT_HIT_BINS_PCT
from testbed.report.metrics import producer_of
from testbed.report.rundir import ReportError, Tokens, load_run

CANNED = Path(__file__).parent / "fixtures" / "run-canned"
TOP_KEYS = ["scenario", "backend", "clock", "scale", "modes", "comparisons", "paired",
            "expectations", "passed", "failures", "fidelity", "resources"]
MODE_KEYS = ["requests_total", "requests_completed", "requests_failed", "tokens_lost",
             "tokens_duplicated", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "ttft_high_hit_p50_s",
             "tpot_p50_ms", "e2e_p99_s", "goodput_rps", "handoff_stall_p99_ms", "relay_overhead_p50_ms",
             "relay_overhead_p90_ms", "after_prefill_p50_s", "after_prefill_p90_s", "wan_bytes",
             "intra_dc_bytes",
             "rld_token_share", "relayed_share", "kv_prediction_error_p50",
             "kv_prediction_error_p90", "wan_rate_max_over_shaper", "p_hit_rate_mean",
             "md_hit_rate_mean", "drc_hit_gap", "wan_kv_share", "decision_regret_share",
             "rss_slope_max_mb_per_min", "fd_slope_max_per_min", "md_imbalance", "p_imbalance",
             "hindsight", "balance", "emulated"]
COMPARISON_KEYS = ["metric", "mode", "baseline", "value", "baseline_value", "ratio", "change_pct"]
PNGS = ["ttft_cdf.png", "wan_throughput.png", "relay_timeline.png", "hit_rates.png"]
INPUTS = ["metadata.json"] + [f"{m}/{f}" for m in ("pdd", "cross-dc-pd")
                              for f in ("requests.jsonl", "events.jsonl", "links.csv")]


def copy_canned(dest: Path) -> Path:
    shutil.copytree(CANNED, dest, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return dest


@pytest.fixture
def run(tmp_path):
    return copy_canned(tmp_path / "run")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The canned run reported once, shared by the read-only tests: (dir, summary)."""
    d = copy_canned(tmp_path_factory.mktemp("built") / "run")
    return d, build_report(d)


def edit_metadata(run: Path, change) -> None:
    md = json.loads((run / "metadata.json").read_text())
    change(md)
    (run / "metadata.json").write_text(json.dumps(md))


def test_canned_files_are_what_the_generator_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_canned", CANNED / "make_canned.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write(tmp_path)
    for name in INPUTS:
        assert (tmp_path / name).read_text() == (CANNED / name).read_text(), name


def test_summary_json_matches_the_contract_keys_exactly(built):
    run, summary = built
    s = json.loads((run / "summary.json").read_text())
    assert list(s) == TOP_KEYS
    assert list(s["modes"]) == ["pdd", "cross-dc-pd"]
    for m in s["modes"].values():
        assert list(m) == MODE_KEYS
        assert list(m["emulated"]) == ["wan_bytes", "intra_dc_bytes"]
        assert m["wan_bytes"] == m["emulated"]["wan_bytes"] * 10  # k = 10
    assert s["comparisons"] and all(list(c) == COMPARISON_KEYS for c in s["comparisons"])
    assert all(list(e) == ["name", "passed", "value", "bound"] for e in s["expectations"])
    assert (s["scenario"], s["backend"], s["scale"]) == ("canned-wan-fault", "userspace", 10.0)
    assert s["clock"] == "emulated"  # a run directory without a clock is the emulator's
    assert s == summary


def test_paired_metrics_are_over_the_canned_requests_pdd_did_not_relay(built):
    _, summary = built
    # the canned p-md requests of pdd (14 of 20: 3, 7, 9, 11, 15 and 18 went through RLD)
    # have the baseline's TTFT exactly (make_canned.py models a p-md request the same in
    # both modes)
    assert summary["paired"] == [{"mode": "pdd", "baseline": "cross-dc-pd",
                                  "paired_ttft_ratio_p50": 1.0, "n": 14}]


def test_canned_figures(built):
    _, s = built
    pdd, base = s["modes"]["pdd"], s["modes"]["cross-dc-pd"]
    assert (pdd["requests_total"], pdd["requests_failed"], base["requests_failed"]) == (20, 0, 1)
    assert pdd["relayed_share"] == pytest.approx(6 / 20)   # 5 p-rld-md + 1 rld-only
    assert base["relayed_share"] == 0 and base["handoff_stall_p99_ms"] is None
    assert pdd["ttft_p90_s"] < base["ttft_p90_s"]
    assert [(e["name"], e["passed"]) for e in s["expectations"]] == [
        ("pdd-no-token-lost", True), ("pdd-ttft-p90-below-0.6x", True),
        ("rld-is-a-mask", True), ("handoff-stall-under-200ms", False)]
    assert s["passed"] is False
    # the verdict names its reason: the failed expectation (no mode lost a token)
    assert s["failures"] == ["expectation failed: handoff-stall-under-200ms "
                             "(346.0, bound handoff_stall_p99_ms of pdd < 200)"]


def test_lost_tokens_of_any_mode_are_named_as_a_reason():
    from testbed.report.summary import failures
    modes = {"pdd": {"tokens_lost": 0, "tokens_duplicated": 0, "requests_failed": 0},
             "cross-dc-pd": {"tokens_lost": 293, "tokens_duplicated": 0, "requests_failed": 28,
                             "requests_mismatched": 0}}
    assert failures(modes, [{"name": "x", "passed": True, "value": 1, "bound": "b"}]) == [
        "cross-dc-pd: 293 token positions never delivered (28 requests failed)"]


def test_report_md_has_tables_comparisons_expectations_paper_and_plots(built):
    run, _ = built
    md = (run / "report.md").read_text()
    for text in ["**Result: FAILED** (failed: handoff-stall-under-200ms)",
                 "| metric | `pdd` | `cross-dc-pd` |", "| TTFT p90 |", "(emulated ",
                 "| ttft_p90_s | `pdd` | `cross-dc-pd` |",
                 "- **PASS** `pdd-no-token-lost`", "- **FAIL** `handoff-stall-under-200ms`",
                 "## Versus the paper", "-51.5%", "4.2 / 18.3 / 29.7 s", "6.2%",
                 "fault_start 0 wan_rate", "backend: userspace; bandwidth scale k = 10",
                 "WAN 10 Gbit/s, RTT 40 ms"]:
        assert text in md, text
    for png in PNGS:
        assert f"]({png})" in md
        data = (run / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000


def test_rerunning_is_idempotent(run):
    first = build_report(run)
    outputs = {p: (run / p).read_bytes() for p in ["summary.json", "report.md"] + PNGS}
    assert build_report(run) == first
    assert {p: (run / p).read_bytes() for p in outputs} == outputs
    assert sorted(p.name for p in run.iterdir() if p.is_file()) == sorted(
        ["metadata.json", "summary.json", "report.md"] + PNGS)


def test_passed_needs_every_expectation_and_no_lost_or_duplicated_token(run):
    edit_metadata(run, lambda md: md["resolved"]["expectations"].pop())
    assert build_report(run)["passed"] is True
    path = run / "cross-dc-pd" / "requests.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[0])
    rec["tokens_duplicated"] = 1
    path.write_text("\n".join([json.dumps(rec)] + lines[1:]) + "\n")
    s = build_report(run)
    assert s["passed"] is False and all(e["passed"] for e in s["expectations"])
    md = (run / "report.md").read_text()
    assert "- **FAIL** `cross-dc-pd` lost 0 and duplicated 1 tokens" in md


def test_missing_data_gives_notes_not_crashes(run):
    build_report(run)
    for mode in ("pdd", "cross-dc-pd"):
        (run / mode / "links.csv").unlink()
    (run / "pdd" / "requests.jsonl").write_text("")
    s = build_report(run)
    md = (run / "report.md").read_text()
    assert s["modes"]["pdd"]["requests_total"] == 0 and s["modes"]["pdd"]["ttft_p50_s"] is None
    assert "WAN throughput (nominal scale): not drawn (no WAN samples" in md
    assert "pdd/links.csv is missing" in md
    assert not (run / "wan_throughput.png").exists()          # stale plot removed
    assert (run / "ttft_cdf.png").exists()                    # cross-dc-pd still has TTFTs


def test_a_run_with_only_metadata_still_reports(tmp_path):
    (tmp_path / "metadata.json").write_text(json.dumps({"scenario": "empty", "modes": ["pdd"]}))
    s = build_report(tmp_path)
    assert s["passed"] is True and s["comparisons"] == []
    md = (tmp_path / "report.md").read_text()
    assert "not drawn" in md and "Needs modes `pdd` and `cross-dc-pd`" in md
    assert not any(tmp_path.glob("*.png"))


def test_an_expectation_on_an_unknown_metric_is_an_error_naming_it(run):
    edit_metadata(run, lambda md: md["resolved"]["expectations"].append(
        {"name": "bogus", "mode": "pdd", "metric": "ttft_p75_s", "op": "<", "value": 1}))
    with pytest.raises(ExpectationError, match="'bogus'.*unknown metric 'ttft_p75_s'"):
        build_report(run)


def test_reading_errors_and_a_truncated_last_line(run, tmp_path):
    with pytest.raises(ReportError, match="no metadata.json"):
        load_run(tmp_path / "nowhere")
    events = run / "pdd" / "events.jsonl"
    good = events.read_text()
    events.write_text(good + '{"t_mono": 1, "ki')
    assert load_run(run).mode("pdd").notes == ("pdd/events.jsonl: dropped a truncated last line",)
    events.write_text('{"t_mono": 1, "ki\n' + good)
    with pytest.raises(ReportError, match=r"events.jsonl:1: not valid JSON"):
        load_run(run)


def test_default_hit_bins_are_the_workload_packages():
    from testbed.workload.hitrate import PDD_BINS_PCT
    assert DEFAULT_HIT_BINS_PCT == PDD_BINS_PCT


def test_a_workload_request_without_a_record_fails_the_run(run):
    ids = [json.loads(x)["id"] for x in (run / "pdd" / "requests.jsonl").read_text().splitlines()]
    lines = [{"id": i} for i in ids] + [{"id": "w0", "warmup": True}, {"id": "never-recorded"}]
    (run / "pdd" / "workload.jsonl").write_text("".join(json.dumps(w) + "\n" for w in lines))
    summary = build_report(run)
    assert summary["modes"]["pdd"]["requests_unrecorded"] == 1
    assert "requests_unrecorded" not in summary["modes"]["cross-dc-pd"]  # no workload file
    assert not summary["passed"]
    assert any(f.startswith("pdd: 1 requests of the workload without a record")
               for f in summary["failures"])


def test_the_fidelity_table_shows_the_hosts_steal_beside_its_busy_share():
    from testbed.report.render import _fidelity
    host = {"cpu_busy_share": [0.43, 0.45], "mem_peak_bytes": 2**30, "mem_peak_share": 0.03,
            "cpu_steal_share": [0.012, 0.0139], "cpu_steal_worst_share": 0.24,
            "cpu_steal_worst_at_s": 7.5}
    md = "\n".join(_fidelity({"verdict": "faithful", "policy": "report", "tolerances": {},
                              "modes": {"pdd": {"host": host}}}))
    assert "| pdd | host: CPU busy per core, peak memory | 43%, 45%; 1.00 GiB (3%) |" in md
    assert ("| pdd | host: CPU time the hypervisor took (steal) per core; worst core over one "
            "sample | 1.2%, 1.4%; 24% at +7.5 s |") in md
    older = {k: host[k] for k in ("cpu_busy_share", "mem_peak_bytes", "mem_peak_share")}
    assert "steal" not in "\n".join(_fidelity({"modes": {"pdd": {"host": older}}}))


def test_the_cli_table_adds_the_steal_note_under_a_degraded_verdicts_reasons():
    from testbed.report.summary import summary_table
    fid = {"verdict": "degraded", "policy": "report",
           "reasons": ["pdd: network: delay line wan/a>b lateness p99 1.58 ms > 1 ms"],
           "host_steal": {"share": 0.0442, "mode": "pdd", "worst_share": 0.21}}
    text = summary_table({"scenario": "s", "backend": "userspace", "scale": 25.0,
                          "modes": {"pdd": {}}, "expectations": [], "passed": True,
                          "fidelity": fid})
    lines = text.splitlines()
    assert lines[-3:-1] == [
        "fidelity degraded",
        "  because pdd: network: delay line wan/a>b lateness p99 1.58 ms > 1 ms"]
    assert lines[-1].startswith("  note: host: the hypervisor took 4.4% of the cores' time in pdd")


def test_a_record_tokens_are_read_as_columns_that_read_back_as_rows(run):
    rows = [[0, 318, 1.041687, "RLD"], [1, 7, 1.074177, "RLD"], [2, 56, 1.2, "MD"]]
    toks = Tokens.of(rows)
    assert isinstance(toks, Tokens) and len(toks) == 3 and toks == rows
    assert toks[2] == (2, 56, 1.2, "MD") and toks[-1] == toks[2] and toks[1:] == [
        (1, 7, 1.074177, "RLD"), (2, 56, 1.2, "MD")]
    assert [producer_of(t) for t in toks] == ["RLD", "RLD", "MD"]
    # 25 bytes a token in its buffers, against ~220 for the parsed lists
    assert sum(len(memoryview(c).cast("B")) for c in (toks._pos, toks._ids, toks._t)) \
        + len(toks._who) == 25 * 3
    # rows that do not fit the columns stay as read; no rows stay falsy
    for odd in ([[0, 1, 1.0]], [[0, "x", 1.0, "MD"]], [[0, 1, 1.0, 3]], [[0, 2 ** 70, 1.0, "MD"]]):
        assert Tokens.of(odd) is odd
    assert not Tokens.of([]) and Tokens.of([[0, 1, 2, None]])[0] == (0, 1, 2.0, None)
    recs = load_run(run).mode("pdd").requests
    assert all(isinstance(r["tokens"], Tokens) for r in recs if r.get("tokens"))


def test_a_broken_line_before_the_last_is_an_error_naming_it(run):
    reqs = run / "pdd" / "requests.jsonl"
    lines = reqs.read_text().splitlines()
    reqs.write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")
    with pytest.raises(ReportError, match=r"requests.jsonl:2: not valid JSON"):
        load_run(run)


def test_the_topology_line_reads_both_wan_directions():
    from testbed.report.render import topology_line

    topo = {"name": "t", "datacenters": [{"name": "a", "hosts": [{"name": "p1"}]}],
            "wan": {"a_to_b": {"rate_gbit": 100.0, "delay_ms": 15.0},
                    "b_to_a": {"rate_gbit": 40.0, "delay_ms": 5.0}}}
    assert topology_line(topo) == "t: DC a (p1); WAN 100/40 Gbit/s, RTT 20 ms"
    topo["wan"]["b_to_a"] = {"rate_gbit": 100.0, "delay_ms": 15.0}
    assert topology_line(topo).endswith("WAN 100 Gbit/s, RTT 30 ms")
    assert topology_line({"name": "t", "wan": {}}) == "t"  # no WAN recorded: none shown
