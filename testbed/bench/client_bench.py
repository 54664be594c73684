"""Run an external benchmark client against the gateway on loopback role processes.

``python -m testbed.bench.client_bench --out DIR [--mode pdd] -- COMMAND ...``
starts P, RLD, MD and the router as loopback processes (``procs.RoleProcesses``),
the OpenAI-compatible gateway next to them, runs COMMAND unmodified (its
arguments may say ``{url}``, ``{base_url}``, ``{model}`` and ``{tokenizer}``:
``http://127.0.0.1:PORT``, the same + ``/v1``, the served model, the
tokenizer directory; ``{trace}``: with ``--mooncake-rows N``, the first N rows of
the shipped Mooncake trace scaled for the tiny model, ``scale_trace``), stops everything, verifies every recorded request
against the greedy decode and writes ``DIR/gateway-stats.json``: requests,
completed, verified, and TTFT p50/p90 from the gateway's records, both as
the roles delivered it (``ttft_s``: REQUEST sent -> token 0 received) and
as the HTTP client could see it (``ttft_http_s``: request received -> token 0
written). The client's stdout and stderr go to ``DIR/client.stdout`` and
``DIR/client.stderr``; the records to ``DIR/requests.jsonl``.

No emulated network: every role is on 127.0.0.1, so these figures check
the gateway and the client's measurement, not the PDD design.
Exit code: the client's, or 1 if a completed request's tokens differ.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from testbed.pdd.run.client_command import client_argv
from testbed.pdd.run.verify import gateway_stats
from testbed.pdd.run.config import RUN_MODEL, ClusterConfig, one_of_each, parse_config
from testbed.pdd.roles.gateway import DEFAULT_MODEL
from testbed.pdd.run.procs import RoleProcesses, free_port, loopback_config
from testbed.pdd.compute.text import TOKENIZER_DIR
from testbed.workload.mooncake import MOONCAKE_TRACE, scale_trace

# the model and pacing of a scenario (testbed/scenario/roles.py), on loopback
BENCH_CONFIG = {
    "model": dict(RUN_MODEL),
    "timing": {"time_scale": 0.5, "kv_scale_k": 10, "token_scale": 1, "connect_timeout_s": 20.0},
    "client": {"request_timeout_s": 120.0, "report_grace_s": 1.0},
    "instances": one_of_each(),  # ports are picked by loopback_config
}


def bench_config(mode: str) -> ClusterConfig:
    return loopback_config(parse_config(dict(BENCH_CONFIG, mode=mode), "<client_bench>"))


def run(command: list[str], out: Path, mode: str,
        mooncake_rows: int = 0) -> tuple[int, dict]:
    from testbed.pdd.run.verify import verify_records

    out.mkdir(parents=True, exist_ok=True)
    cfg = bench_config(mode)
    port, records_path = free_port(), out / "requests.jsonl"
    records_path.unlink(missing_ok=True)
    trace = out / "mooncake-slice.jsonl"
    argv = client_argv(command, "127.0.0.1", port, out, DEFAULT_MODEL, TOKENIZER_DIR, trace)
    if mooncake_rows:
        scale_trace(MOONCAKE_TRACE, trace, mooncake_rows)
    with RoleProcesses(cfg, out) as procs:
        procs.start()
        procs.start_gateway("client", port, records_path)
        with open(out / "client.stdout", "wb") as so, open(out / "client.stderr", "wb") as se:
            code = subprocess.run(argv, stdout=so, stderr=se, check=False).returncode
    records = [json.loads(x) for x in records_path.read_text().splitlines() if x.strip()]
    stats = dict(gateway_stats(records, verify_records(records, cfg.model)),
                 command=argv, client_exit=code, mode=mode)
    (out / "gateway-stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    return code, stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.bench.client_bench",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for records, logs, stats")
    ap.add_argument("--mode", default="pdd", help="pdd | cross-dc-pd | same-dc-pd | p-rld")
    ap.add_argument("--mooncake-rows", type=int, default=0,
                    help="write DIR/mooncake-slice.jsonl ({trace}): this many rows, scaled")
    ap.add_argument("command", nargs="+", help="-- COMMAND ARGS ({url}, {base_url}, "
                    "{model}, {tokenizer}, {out}, {trace}, {block_tokens} are filled in)")
    args = ap.parse_args(argv)
    code, stats = run(args.command, Path(args.out), args.mode, args.mooncake_rows)
    print(json.dumps({k: v for k, v in stats.items() if k != "command"}))
    return code or (1 if stats["mismatched"] else 0)


if __name__ == "__main__":
    sys.exit(main())
