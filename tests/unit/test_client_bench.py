"""``python -m testbed.bench.client_bench``: an unmodified client command against the
gateway on loopback roles, then the gateway's own TTFT figures and verification."""

from __future__ import annotations

import json
import sys

import pytest

from testbed.bench.client_bench import main
from testbed.histogram import percentile
from testbed.pdd.run.verify import gateway_stats
from testbed.pdd.run.verify import Verdict


def test_percentile_interpolates_like_numpy():
    assert percentile([], 50) is None
    assert percentile([3.0], 90) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(range(11)), 90) == pytest.approx(9.0)


def test_stats_count_only_completed_requests():
    recs = [{"id": 0, "status": "completed", "pipeline": "p-md", "ttft_s": 0.1,
             "gateway": {"ttft_http_s": 0.12}},
            {"id": 1, "status": "completed", "pipeline": "p-rld-md", "ttft_s": 0.3,
             "gateway": {"ttft_http_s": 0.33}},
            {"id": 2, "status": "failed", "pipeline": "p-md", "ttft_s": 9.0,
             "gateway": {"ttft_http_s": 9.0}}]
    verdicts = [Verdict(0, "completed", True, True, None, 4),
                Verdict(1, "completed", False, False, 2, 4),
                Verdict(2, "failed", False, True, None, 1)]
    s = gateway_stats(recs, verdicts)
    assert (s["requests"], s["completed"], s["verified"], s["mismatched"]) == (3, 2, 1, [1])
    assert s["pipelines"] == {"p-md": 1, "p-rld-md": 1}
    assert s["ttft_s_p50"] == pytest.approx(0.2) and s["ttft_http_s_p90"] == pytest.approx(0.309)


def test_a_client_command_runs_against_the_gateway(tmp_path, capsys):
    pytest.importorskip("openai")
    script = ("import openai, sys; c = openai.OpenAI(base_url=sys.argv[1], api_key='x'); "
              "[c.completions.create(model=sys.argv[2], prompt='hi', max_tokens=6) "
              "for _ in range(3)]; print('ok')")
    code = main(["--out", str(tmp_path), "--", sys.executable, "-c", script, "{base_url}",
                 "{model}"])
    assert code == 0, (tmp_path / "client.stderr").read_text()
    assert (tmp_path / "client.stdout").read_text() == "ok\n"
    stats = json.loads((tmp_path / "gateway-stats.json").read_text())
    assert (stats["requests"], stats["completed"], stats["verified"]) == (3, 3, 3)
    assert 0 < stats["ttft_s_p50"] <= stats["ttft_http_s_p50"]
    assert json.loads(capsys.readouterr().out)["client_exit"] == 0


def test_a_mooncake_slice_is_scaled_like_the_scenario(tmp_path):
    from testbed.workload.mooncake import MOONCAKE_TRACE, scale_trace

    assert scale_trace(MOONCAKE_TRACE, tmp_path / "slice.jsonl", 5) == 5
    src = [json.loads(x) for x in MOONCAKE_TRACE.read_text().splitlines()[:5]]
    got = [json.loads(x) for x in (tmp_path / "slice.jsonl").read_text().splitlines()]
    assert [r["input_length"] for r in got] == [-(-r["input_length"] // 32) for r in src]
    assert [(r["hash_ids"], r["output_length"], r["timestamp"]) for r in got] == \
        [(r["hash_ids"], r["output_length"], r["timestamp"]) for r in src]


def test_serves_verify_step_writes_the_gateway_figures(tmp_path):
    """What ``testbed serve`` does after teardown: verify.json and gateway-stats.json from
    the gateway's records (one exact request, one with a wrong token)."""
    import json

    from testbed.pdd.compute.model import build_model
    from testbed.pdd.run.config import RUN_MODEL, one_of_each, parse_config
    from testbed.scenario.runner import verify_mode

    cfg = {"model": dict(RUN_MODEL), "instances": one_of_each()}
    (tmp_path / "cluster.json").write_text(json.dumps(cfg))
    model = build_model(parse_config(cfg).model)
    prompt = [5, 9, 2, 7]
    ref = model.greedy_generate(prompt, 4)
    bad = list(ref[:-1]) + [(ref[-1] + 1) % 50]

    def record(i, ids):
        return {"id": i, "status": "completed", "pipeline": "p-md", "prompt": prompt,
                "max_out": 4, "tokens": [[p, t, 0.1 * p, "md"] for p, t in enumerate(ids)],
                "ttft_s": 0.1 * (i + 1), "gateway": {"ttft_http_s": 0.1 * (i + 1) + 0.01}}
    (tmp_path / "requests.jsonl").write_text(
        "".join(json.dumps(record(i, ids)) + "\n" for i, ids in enumerate([ref, bad])))
    out = verify_mode(tmp_path, gateway=True)
    stats = json.loads((tmp_path / "gateway-stats.json").read_text())
    assert out == {"checked": 2, "mismatched": [1], "gateway": stats}
    assert json.loads((tmp_path / "verify.json").read_text()) == {"checked": 2,
                                                                 "mismatched": [1]}
    assert (stats["completed"], stats["verified"], stats["mismatched"]) == (2, 1, [1])
    assert stats["ttft_s_p50"] == pytest.approx(0.15)
