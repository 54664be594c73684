"""The engine microbenchmark runs (the hash engine only, a short context: milliseconds)."""

from __future__ import annotations

import json

from testbed.bench import engine_bench


def test_engine_bench_prints_per_token_figures(capsys):
    engine_bench.main(["--engines", "hash", "--contexts", "10", "50", "--min-s", "0"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["engine"], r["context"]) for r in rows] == [("hash", 10), ("hash", 50)]
    assert all(0 < r[k] < 1000 for r in rows
               for k in ("decode_step_us", "prefill_us_per_token", "extend_us_per_token"))
