"""The KV per-byte microbenchmark runs and ships every token (a small prompt, seconds)."""

from __future__ import annotations

import json

from testbed.bench import kv_bench


def test_kv_bench_runs_both_parts_at_modeled_size(capsys):
    kv_bench.main(["--tokens", "96", "--repeat", "1"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["part"] for r in rows] == ["codec", "tcp"]
    # 96 tokens x 32 x 50 KB / 25 = 6.1 MB of KV, plus two frames' headers and fixed fields
    assert all(abs(r["modeled_mb"] - 6.144) < 0.001 for r in rows)
    assert all(r["cpu_s"] > 0 for r in rows)
