"""testbed.report.clients: an external client's TTFT summary, found and set beside ours."""

import json

import pytest

from testbed.report.clients import agreement, client_ttft


def test_aiperfs_summary_is_found_and_read_in_seconds(tmp_path):
    art = tmp_path / "aiperf" / "run"
    art.mkdir(parents=True)
    (art / "profile_export_aiperf.json").write_text(json.dumps({
        "time_to_first_token": {"unit": "ms", "avg": 30.0, "p50": 20.0, "p90": 45.0},
        "request_latency": {"unit": "ms", "p50": 900.0, "p90": 1000.0}}))
    got = client_ttft(tmp_path)
    assert got["client"] == "aiperf"
    assert (got["p50_s"], got["p90_s"]) == pytest.approx((0.020, 0.045))


def test_guidellms_report_is_found(tmp_path):
    (tmp_path / "gateway-stats.json").write_text(json.dumps({"ttft_s_p50": 1}))
    (tmp_path / "guidellm.json").write_text(json.dumps({"benchmarks": [{"metrics": {
        "time_to_first_token_ms": {"successful": {"percentiles": {"p50": 19.5,
                                                                  "p90": 22.4}}}}}]}))
    got = client_ttft(tmp_path)
    assert got["client"] == "guidellm"
    assert (got["p50_s"], got["p90_s"]) == pytest.approx((0.0195, 0.0224))


def test_nothing_known_is_none_not_a_made_up_figure(tmp_path):
    assert client_ttft(tmp_path) is None
    (tmp_path / "other.json").write_text(json.dumps({"benchmarks": []}))
    (tmp_path / "broken.json").write_text("{not json")
    sub = tmp_path / "a"
    sub.mkdir()
    (sub / "profile_export_aiperf.json").write_text(json.dumps(
        {"time_to_first_token": {"unit": "furlongs", "p50": 1, "p90": 2}}))
    assert client_ttft(tmp_path) is None


def test_agreement_is_client_over_gateway_for_both_clocks():
    stats = {"ttft_http_s_p50": 0.2, "ttft_http_s_p90": 0.5, "ttft_s_p50": 0.19,
             "ttft_s_p90": None}
    got = agreement(stats, {"p50_s": 0.21, "p90_s": 0.55})
    assert got == {"client_over_ttft_http_s_p50": pytest.approx(1.05),
                   "client_over_ttft_http_s_p90": pytest.approx(1.1),
                   "client_over_ttft_s_p50": pytest.approx(0.21 / 0.19, abs=1e-4),
                   "client_over_ttft_s_p90": None}
