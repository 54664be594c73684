"""After a run: check every request's tokens against a plain single-process greedy decode.

Owns ``verify_records``: for each requests.jsonl record with a ``prompt``,
recompute ``model.greedy_generate(prompt, max_out)`` with the run's model
config (so on the roles' engine, torch or hash: ``engine.build_model``) and compare with the token ids the client received, in position
order. A request matches only if it has exactly ``max_out`` positions
0..max_out-1 and every id equals the reference. Failed requests are
checked too (their received prefix must match; they never count as a
match). The reference stops where the model's context does (``max_context``:
a request the roles rejected for its length has no reference beyond it, and
a token received there is a mismatch). Not in the client's hot path.

``gateway_stats`` sums up a gateway's records and their verdicts (requests,
completed, verified, pipelines, TTFT p50/p90 as the roles saw it, ``ttft_s``,
and as the HTTP client could, ``ttft_http_s``): what an external benchmark
client's own figures are compared with (docs/benchmark-clients.md).

Example (also ``python -m testbed.pdd.run.verify requests.jsonl config.json``)::

    results = verify_records(records, cfg.model)
    assert all(r.match for r in results if r.status == "completed")
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Iterable

from testbed.histogram import percentile
from testbed.pdd.compute.engine import ModelConfig, build_model


@dataclass(frozen=True)
class Verdict:
    id: object
    status: str
    match: bool  # the full sequence equals the reference
    prefix_ok: bool  # every received position equals the reference
    first_mismatch: int | None  # position, or None
    n_received: int


def verify_records(records: Iterable[dict], model_cfg: ModelConfig) -> list[Verdict]:
    """One Verdict per record (see the module docstring)."""
    model = build_model(model_cfg)
    out = []
    for rec in records:
        got = {int(t[0]): int(t[1]) for t in rec.get("tokens") or ()}
        room = max(0, model_cfg.max_context - len(rec["prompt"]))
        ref = model.greedy_generate(rec["prompt"], min(rec["max_out"], room))
        bad = [p for p, tok in sorted(got.items()) if p >= len(ref) or ref[p] != tok]
        full = sorted(got) == list(range(len(ref)))
        out.append(Verdict(rec.get("id"), rec.get("status", "?"),
                           full and not bad and rec.get("status") == "completed",
                           not bad, bad[0] if bad else None, len(got)))
    return out



def gateway_stats(records: list[dict], verdicts) -> dict:
    """The figures of the module docstring from a gateway's requests.jsonl records."""
    done = [r for r in records if r["status"] == "completed"]
    out = {"requests": len(records), "completed": len(done),
           "verified": sum(1 for v in verdicts if v.match),
           "mismatched": [v.id for v in verdicts if not v.prefix_ok
                          or (v.status == "completed" and not v.match)],
           "pipelines": {}}
    for r in done:
        out["pipelines"][r["pipeline"]] = out["pipelines"].get(r["pipeline"], 0) + 1
    for key, values in (("ttft_s", [r["ttft_s"] for r in done]),
                        ("ttft_http_s", [r["gateway"]["ttft_http_s"] for r in done])):
        for q in (50, 90):
            p = percentile([x for x in values if x is not None], q)
            out[f"{key}_p{q}"] = None if p is None else round(p, 6)
    return out


def main(argv: list[str] | None = None) -> int:
    from testbed.pdd.run.config import load_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("requests", help="requests.jsonl written by the client")
    ap.add_argument("config", help="the run's cluster config JSON (for the model config)")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    with open(args.requests) as f:
        records = [json.loads(line) for line in f if line.strip()]
    verdicts = verify_records(records, cfg.model)
    for v in verdicts:
        print(json.dumps(v.__dict__))
    bad = [v for v in verdicts if v.status == "completed" and not v.match]
    print(f"{len(verdicts)} requests, {len(bad)} completed requests differ from greedy decode")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
