"""testbed.bench.clients: the external-client matrix's commands and its table, from cell
folders written here (what serve and the clients write, in miniature)."""

import json
import sys
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.bench.clients import (HF_NAME, RUNS, check_clients, client_command, clients_doc,
                                   clients_md, make_hf_cache, run_clients, selected)
from testbed.errors import TestbedError
from testbed.pdd.run.client_command import client_argv


def _record(i: int, ttft_http: float, n: int = 4, max_out: int = 4) -> dict:
    return {"id": i, "status": "completed", "max_out": max_out, "ttft_s": ttft_http - 0.001,
            "tokens": [[p, 7, 0.1 * p, "MD"] for p in range(n)],
            "gateway": {"id": f"cmpl-{i}", "ttft_http_s": ttft_http}}


def _cell(cell: Path, records: list[dict], client_p50: float, client_p90: float,
          gw_p50: float, gw_p90: float, client_exit: int = 0, mismatched=()) -> None:
    cell.mkdir(parents=True)
    (cell / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    stats = {"requests": len(records), "completed": len(records),
             "verified": len(records) - len(mismatched), "mismatched": list(mismatched),
             "pipelines": {"p-md": len(records)}, "ttft_s_p50": gw_p50 - 0.001,
             "ttft_s_p90": gw_p90 - 0.001, "ttft_http_s_p50": gw_p50, "ttft_http_s_p90": gw_p90,
             "client_exit": client_exit,
             "client_ttft": {"client": "x", "p50_s": client_p50, "p90_s": client_p90},
             "client_over_ttft_http_s_p50": round(client_p50 / gw_p50, 4),
             "client_over_ttft_http_s_p90": round(client_p90 / gw_p90, 4)}
    (cell / "gateway-stats.json").write_text(json.dumps(stats))


def _aiperf_export(cell: Path, rows: list[tuple], warmup: int = 0) -> None:
    """rows: (request_start_ns, ttft ms, output tokens[, x_request_id]), written out of
    start order."""
    art = cell / "aiperf"
    art.mkdir()
    lines = [{"metadata": {"request_start_ns": 1, "benchmark_phase": "warmup"},
              "metrics": {"time_to_first_token": {"value": 1.0, "unit": "ms"}}}] * warmup
    lines += [{"metadata": {"request_start_ns": ns, "benchmark_phase": "profiling",
                            "x_request_id": rid[0] if rid else None},
               "metrics": {"time_to_first_token": {"value": ms, "unit": "ms"},
                           "output_sequence_length": {"value": n, "unit": "tokens"}}}
              for ns, ms, n, *rid in reversed(rows)]
    (art / "profile_export.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_aiperf_requests_are_matched_in_start_order_and_compared(tmp_path):
    cell = tmp_path / "aiperf-synthetic" / "pdd"
    recs = [_record(0, 0.500), _record(1, 0.800), _record(2, 0.300)]
    _cell(cell, recs, 0.502, 0.790, 0.500, 0.780)
    # started in record order (ns 10, 20, 30); TTFT 2, 3 and 1 ms above the gateway's
    _aiperf_export(cell, [(10, 502.0, 4), (20, 803.0, 4), (30, 301.0, 4)], warmup=2)
    doc = clients_doc(tmp_path, [RUNS["aiperf-synthetic"]], ["pdd"])
    row = doc["rows"][0]
    assert row["passed"] and doc["passed"], row["problems"]
    pr = row["per_request"]
    assert pr["matched"] == 3 and pr["tokens_exact"] == 3 and pr["matched_by"] == "start order"
    assert (pr["delta_ms_min"], pr["delta_ms_p50"], pr["delta_ms_max"]) == \
        pytest.approx((1.0, 2.0, 3.0))
    assert (row["client_p50_ms"], row["gateway_p50_ms"], row["roles_p50_ms"]) == \
        (502.0, 500.0, 499.0)
    assert "| aiperf-synthetic | pdd | 3 / 3 of 3 | p-md 3 |" in clients_md(doc)


def test_aiperf_requests_are_matched_by_their_x_request_id_when_recorded(tmp_path):
    """Two fixed-schedule requests that start within microseconds reach the gateway in
    either order: the start order pairs them crosswise, the X-Request-ID does not."""
    cell = tmp_path / "aiperf-mooncake" / "pdd"
    recs = [_record(0, 0.500, n=3, max_out=3), _record(1, 1.200, n=9, max_out=9),
            _record(2, 0.300)]
    for r, rid in zip(recs, ("b", "a", "c")):  # the gateway got "b" first
        r["gateway"]["x_request_id"] = rid
    _cell(cell, recs, 0.502, 1.2, 0.500, 1.2)
    _aiperf_export(cell, [(10, 1201.0, 9, "a"), (11, 502.0, 3, "b"), (30, 301.0, 4, "c")])
    pr = clients_doc(tmp_path, [RUNS["aiperf-mooncake"]], ["pdd"])["rows"][0]["per_request"]
    assert pr["matched_by"] == "x_request_id" and pr["tokens_exact"] == 3
    assert (pr["delta_ms_min"], pr["delta_ms_max"]) == pytest.approx((1.0, 2.0))
    for r in recs:  # the same export by start order: two crosswise pairs
        del r["gateway"]["x_request_id"]
    (cell / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    row = clients_doc(tmp_path, [RUNS["aiperf-mooncake"]], ["pdd"])["rows"][0]
    assert row["per_request"]["tokens_exact"] == 1 and not row["passed"]
    assert "counted the delivered tokens of 1 of 3" in "; ".join(row["problems"])


def test_a_client_more_than_ten_percent_off_the_gateway_fails_the_cell(tmp_path):
    cell = tmp_path / "aiperf-synthetic" / "cross-dc-pd"
    _cell(cell, [_record(0, 0.5)], 0.560, 0.560, 0.500, 0.500)  # 1.12x
    row = clients_doc(tmp_path, [RUNS["aiperf-synthetic"]], ["cross-dc-pd"])["rows"][0]
    assert not row["passed"]
    assert row["problems"] == ["client TTFT p50 1.1200x the gateway's (tolerance 10%)",
                               "client TTFT p90 1.1200x the gateway's (tolerance 10%)"]
    assert row["per_request"] is None  # no per-request export: said, not made up


def test_guidellm_is_matched_by_response_id_and_its_token_count_checked(tmp_path):
    cell = tmp_path / "guidellm-synthetic" / "pdd"
    _cell(cell, [_record(0, 0.6), _record(1, 0.7)], 0.605, 0.705, 0.6, 0.7)
    (cell / "guidellm.json").write_text(json.dumps({"benchmarks": [{"requests": {
        "successful": [{"response_id": "cmpl-1", "time_to_first_token_ms": 704.0,
                        "output_tokens": 4},
                       {"response_id": "cmpl-0", "time_to_first_token_ms": 605.0,
                        "output_tokens": 3}]}}]}))  # counted 3 of the 4 delivered
    row = clients_doc(tmp_path, [RUNS["guidellm-synthetic"]], ["pdd"])["rows"][0]
    assert row["per_request"]["delta_ms_max"] == pytest.approx(5.0)
    assert row["problems"] == ["the client counted the delivered tokens of 1 of 2 requests"]


def test_failed_client_unverified_tokens_and_a_missing_cell_are_named(tmp_path):
    _cell(tmp_path / "aiperf-synthetic" / "pdd", [_record(0, 0.5)], 0.5, 0.5, 0.5, 0.5,
          client_exit=1, mismatched=[0])
    doc = clients_doc(tmp_path, [RUNS["aiperf-synthetic"]], ["pdd", "cross-dc-pd"])
    bad, missing = doc["rows"]
    assert bad["problems"] == ["the client exited 1",
                               "0 of 1 verified against greedy decode, 1 differ"]
    assert missing["problems"] == ["no gateway-stats.json (the run did not finish)"]
    assert not doc["passed"] and "## Failed" in clients_md(doc)


def test_every_runs_command_fills_in_with_serves_placeholders(tmp_path):
    paths = {"aiperf": "/opt/aiperf", "guidellm": "/opt/guidellm"}
    for run in RUNS.values():
        argv = client_argv(client_command(run, paths, 12, 1.5, tmp_path / "hf"), "10.0.0.5",
                           8000, tmp_path, "pdd-tiny", Path("/tok"), tmp_path / "t.jsonl", 16)
        assert paths[run.client] in argv
        assert not any("{" in a for a in argv), argv
        joined = " ".join(argv)
        assert "http://10.0.0.5:8000" in joined
        if run.name == "aiperf-mooncake":
            assert f"HF_HOME={(tmp_path / 'hf').resolve()}" in argv and HF_NAME in argv
            assert argv[argv.index("--input-file") + 1] == str(tmp_path / "t.jsonl")
        elif run.client == "aiperf":
            assert argv[argv.index("--request-count") + 1] == "12"
            assert argv[argv.index("--request-rate") + 1] == "1.5"
        else:
            assert "kind=constant,rate=1.5" in argv and "kind=max_requests,count=12" in argv


def test_the_hf_cache_holds_the_shipped_tokenizer_under_its_name(tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    root = make_hf_cache(tmp_path / "hf")
    snap = hub.snapshot_download(HF_NAME, cache_dir=root / "hub", local_files_only=True)
    tok = pytest.importorskip("tokenizers").Tokenizer.from_file(str(Path(snap) /
                                                                    "tokenizer.json"))
    assert tok.decode(tok.encode("PDD!").ids) == "PDD!"


def test_run_clients_runs_every_cell_and_a_failed_one_does_not_stop_the_rest(tmp_path):
    paths = {"aiperf": sys.executable, "guidellm": sys.executable}
    seen = []

    def serve_fn(run, mode, command, cell):
        seen.append((run.name, mode, command[0]))
        if mode == "cross-dc-pd":
            raise TestbedError("the network could not be built")
        _cell(cell, [_record(0, 0.5)], 0.5, 0.5, 0.5, 0.5)

    stale = tmp_path / "aiperf-synthetic" / "pdd" / "old.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier run's")
    doc = run_clients(tmp_path, selected(["aiperf-synthetic"]), ["pdd", "cross-dc-pd"],
                      serve_fn, paths)
    assert seen == [("aiperf-synthetic", "pdd", sys.executable),
                    ("aiperf-synthetic", "cross-dc-pd", sys.executable)]
    assert not stale.exists()  # a cell is one serve run
    assert [r["passed"] for r in doc["rows"]] == [True, False]
    assert doc["rows"][1]["problems"] == ["TestbedError: the network could not be built"]
    assert json.loads((tmp_path / "clients.json").read_text())["passed"] is False
    assert (tmp_path / "hf-cache" / "hub").is_dir()


def test_unknown_runs_and_missing_clients_are_refused_by_name(tmp_path):
    with pytest.raises(TestbedError, match="--only aiperf: no such client run"):
        selected(["aiperf"])
    with pytest.raises(TestbedError, match=r"--guidellm /nope/guidellm: no such executable"):
        check_clients(selected(["guidellm-synthetic"]), {"aiperf": "/nope/aiperf",
                                                         "guidellm": "/nope/guidellm"})
    check_clients(selected(["guidellm-synthetic"]), {"aiperf": "/nope/aiperf",
                                                     "guidellm": sys.executable})


@pytest.mark.parametrize("argv, said", [
    (["--rate", "0"], "--rate: expected a number > 0 (req/s), got 0.0"),
    (["--requests", "0"], "--requests: expected an integer >= 1, got 0"),
    (["--only", "guidellm-synthetic", "--guidellm", "/nope/g"], "--guidellm /nope/g: no such"),
])
def test_the_command_refuses_bad_options_before_it_builds_or_writes(tmp_path, capsys, argv,
                                                                    said):
    out = tmp_path / "clients"
    assert main(["bench", "clients", "--out", str(out), *argv]) == 2
    assert said in capsys.readouterr().err
    assert not out.exists()
