"""The external-client matrix on the emulated network: ``testbed bench clients``.

Runs each unmodified benchmark client against a live ``testbed serve``
deployment, once per mode (PDD and the cross-DC baseline), and writes the
table that sets the client's own TTFT beside the gateway's records of the same
requests: ``OUT/clients.md`` and ``OUT/clients.json``, one run folder per cell
(``OUT/RUN/MODE``: serve's folder, the client's own output in it).

The runs (``RUNS``; ``--only`` picks some):

- ``aiperf-synthetic``: AIPerf, ISL/OSL 128/64, Poisson at ``rate`` req/s,
  ``requests`` requests, two-dc topology with the default ``pdd:`` settings;
- ``aiperf-mooncake``: AIPerf replaying scenarios/mooncake-trace.yaml's
  Mooncake load with its fixed schedule, on that scenario's deployment
  (``serve --scenario``); AIPerf looks the tokenizer up only in a Hugging Face
  cache in that mode, so one is made under ``OUT/hf-cache`` with the shipped
  tokenizer under the name ``local/pdd-tiny`` (its documented offline cache);
- ``guidellm-synthetic``: GuideLLM, 128/64 tokens at a constant ``rate``.

Each cell's row (``cell_row``): requests, completed, verified against the
greedy decode, pipelines, TTFT p50/p90 of the client, the gateway
(``ttft_http_s``: HTTP request received -> token 0 written) and the roles
(``ttft_s``: REQUEST sent -> token 0 back), the client over the gateway, and
per request (``per_request``) the client's TTFT minus the gateway's and whether
the client counted the output tokens the roles delivered. AIPerf's requests are
matched to the gateway's records by the ``X-Request-ID`` header AIPerf sends
with each (the gateway keeps it as the record's ``gateway.x_request_id``; start
order only for records without it: two requests of a fixed schedule that start
within microseconds reach the gateway in either order); GuideLLM's by response
id (the gateway's ``cmpl-N``).

A cell passes when the client exited 0, every request completed and matched
the greedy decode, and its TTFT p50 and p90 are within ``TOLERANCE`` of the
gateway's (the external-client acceptance check: an external client and the
testbed's records agree within 10%; docs/benchmark-clients.md).

Running is the caller's (``serve_fn``, so bench does not import the scenario
runner); the table is built from the cell folders alone (``clients_doc``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import TestbedError
from testbed.pdd.compute.text import TOKENIZER_DIR
from testbed.pdd.run.verify import percentile

REPO = Path(__file__).resolve().parents[2]
MODES = ("pdd", "cross-dc-pd")
TOLERANCE = 0.10  # client TTFT p50/p90 within 10% of the gateway's (the acceptance)
HF_NAME = "local/pdd-tiny"  # the tokenizer's name in OUT/hf-cache (AIPerf's Mooncake mode)
_SNAPSHOT = "0" * 40


@dataclass(frozen=True)
class ClientRun:
    name: str
    client: str  # "aiperf" or "guidellm"
    workload: str  # what the table says of the load
    scenario: str | None = None  # repo-relative: its deployment and Mooncake load


RUNS = {r.name: r for r in (
    ClientRun("aiperf-synthetic", "aiperf", "synthetic ISL 128 / OSL 64, Poisson"),
    ClientRun("aiperf-mooncake", "aiperf", "mooncake-trace scenario's Mooncake rows, "
              "fixed schedule", "scenarios/mooncake-trace.yaml"),
    ClientRun("guidellm-synthetic", "guidellm", "synthetic 128 / 64 tokens, constant rate"),
)}

# the versions measured here; torch pinned first, else GuideLLM pulls a multi-GB CUDA build
INSTALL = {"aiperf": "python3 -m venv .venv-bench && .venv-bench/bin/pip install aiperf==0.13.0",
           "guidellm": "python3 -m venv .venv-guidellm && "
                       ".venv-guidellm/bin/pip install torch==2.13.0 guidellm==0.8.1"}


def check_clients(runs: Sequence[ClientRun], paths: dict[str, str]) -> None:
    """TestbedError naming a client executable that the chosen runs need and is missing."""
    for client in sorted({r.client for r in runs}):
        path = paths[client]
        if shutil.which(path) is None:
            raise TestbedError(f"--{client} {path}: no such executable (install it in its "
                               f"own virtualenv: {INSTALL[client]})")


def make_hf_cache(root: Path) -> Path:
    """A Hugging Face cache at ``root`` holding the shipped tokenizer as ``HF_NAME``."""
    repo = root / "hub" / ("models--" + HF_NAME.replace("/", "--"))
    snap = repo / "snapshots" / _SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(TOKENIZER_DIR.glob("*.json")):
        shutil.copyfile(f, snap / f.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(_SNAPSHOT)
    return root


def client_command(run: ClientRun, paths: dict[str, str], requests: int, rate: float,
                   hf_home: Path) -> list[str]:
    """The unmodified client's command line for serve (its ``{...}`` filled in there)."""
    offline = ["env", "HF_HUB_OFFLINE=1"]  # no Hugging Face hub here: the cache or a path
    if run.client == "guidellm":
        return offline + [
            paths["guidellm"], "run",
            "--backend", "kind=openai_http,target={url},model={model},"
                         "request_format=/v1/completions",
            "--profile", f"kind=constant,rate={rate:g}",
            "--constraint", f"kind=max_requests,count={requests}",
            "--tokenizer", "kind=huggingface_auto,model={tokenizer}",
            "--data", "kind=synthetic_text,prompt_tokens=128,output_tokens=64",
            "--seed", "kind=static,value=1", "--output", "kind=json,path={out}/guidellm.json",
            "--disable-progress"]
    common = ["--url", "{url}", "--model", "{model}", "--endpoint-type", "completions",
              "--streaming", "--random-seed", "1", "--ui-type", "none",
              "--no-server-metrics", "--artifact-dir", "{out}/aiperf"]
    if run.scenario is None:
        return [paths["aiperf"], "profile", *common, "--tokenizer", "{tokenizer}",
                "--isl", "128", "--osl", "64", "--extra-inputs", "ignore_eos:true",
                "--request-rate", f"{rate:g}", "--request-count", str(requests)]
    return offline + [f"HF_HOME={hf_home.resolve()}", paths["aiperf"], "profile", *common,
                      "--tokenizer", HF_NAME, "--custom-dataset-type", "mooncake_trace",
                      "--input-file", "{trace}", "--isl-block-size", "{block_tokens}",
                      "--fixed-schedule", "--fixed-schedule-auto-offset"]


ServeFn = Callable[[ClientRun, str, list[str], Path], None]


def run_clients(out: Path, runs: Sequence[ClientRun], modes: Sequence[str], serve_fn: ServeFn,
                paths: dict[str, str], requests: int = 40, rate: float = 2.0) -> dict:
    """Every run x mode through ``serve_fn(run, mode, command, cell_dir)``; the table."""
    check_clients(runs, paths)
    out.mkdir(parents=True, exist_ok=True)
    hf_home = make_hf_cache(out / "hf-cache")
    for run in runs:
        for mode in modes:
            cell = out / run.name / mode
            if cell.exists():
                shutil.rmtree(cell)  # a cell is one serve run, never two mixed
            try:
                serve_fn(run, mode, client_command(run, paths, requests, rate, hf_home), cell)
            except TestbedError as err:  # this cell failed; the others still run
                cell.mkdir(parents=True, exist_ok=True)
                (cell / "error.txt").write_text(f"{type(err).__name__}: {err}\n")
    doc = clients_doc(out, runs, modes)
    (out / "clients.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "clients.md").write_text(clients_md(doc))
    return doc


# -- the table, from the cell folders alone -------------------------------------------------

def _records(cell: Path) -> list[dict]:
    path = cell / "requests.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _aiperf_requests(cell: Path) -> list[tuple[str | None, float, int]] | None:
    """(X-Request-ID, TTFT s, output tokens) per profiled AIPerf request, in start order."""
    path = next(iter(sorted(cell.rglob("profile_export.jsonl"))), None)
    if path is None:
        return None
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        meta, metrics = rec.get("metadata", {}), rec.get("metrics", {})
        if meta.get("benchmark_phase", "profiling") != "profiling" or rec.get("error"):
            continue
        ttft = metrics.get("time_to_first_token", {})
        if ttft.get("unit") != "ms":
            return None
        rows.append((meta.get("request_start_ns", 0), meta.get("x_request_id"),
                     ttft["value"] / 1e3,
                     int(metrics.get("output_sequence_length", {}).get("value", -1))))
    return [(rid, t, n) for _, rid, t, n in sorted(rows, key=lambda r: r[0])]


def _guidellm_requests(cell: Path) -> dict[str, tuple[float, int]] | None:
    """{response id: (TTFT s, output tokens)} of GuideLLM's successful requests."""
    path = cell / "guidellm.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    try:
        reqs = doc["benchmarks"][0]["requests"]["successful"]
    except (KeyError, IndexError, TypeError):
        return None
    return {r["response_id"]: (r["time_to_first_token_ms"] / 1e3, int(r["output_tokens"]))
            for r in reqs if r.get("response_id")}


def per_request(cell: Path, client: str) -> dict | None:
    """Client TTFT minus the gateway's (ms: p50, p90, min, max) over the matched requests,
    and how many of them the client counted exactly the delivered tokens of. None when the
    client's per-request file is missing or cannot be matched to the records."""
    recs = sorted((r for r in _records(cell) if r["status"] == "completed"),
                  key=lambda r: r["id"])
    pairs = []  # (client ttft, client tokens, record)
    if client == "aiperf":
        theirs = _aiperf_requests(cell)
        if not theirs or len(theirs) != len(recs):
            return None
        by_id = {r["gateway"].get("x_request_id"): r for r in recs}
        if None not in by_id and len(by_id) == len(recs):  # the X-Request-ID each sent
            matched_by = "x_request_id"
            pairs = [(t, n, by_id[rid]) for rid, t, n in theirs if rid in by_id]
            if len(pairs) != len(recs):
                return None
        else:  # a gateway that did not record the header: start order
            matched_by = "start order"
            pairs = [(t, n, r) for (_, t, n), r in zip(theirs, recs)]
    else:
        theirs = _guidellm_requests(cell)
        if not theirs:
            return None
        matched_by = "response id"
        by_id = {r["gateway"]["id"]: r for r in recs}
        pairs = [(t, n, by_id[rid]) for rid, (t, n) in theirs.items() if rid in by_id]
        if len(pairs) != len(recs):
            return None
    deltas = [(t - r["gateway"]["ttft_http_s"]) * 1e3 for t, _, r in pairs]
    exact = sum(1 for _, n, r in pairs if n == len(r["tokens"]) == r["max_out"])
    return {"matched": len(pairs), "matched_by": matched_by,
            "delta_ms_p50": round(percentile(deltas, 50), 2),
            "delta_ms_p90": round(percentile(deltas, 90), 2),
            "delta_ms_min": round(min(deltas), 2), "delta_ms_max": round(max(deltas), 2),
            "tokens_exact": exact}


def cell_row(cell: Path, run: ClientRun, mode: str) -> dict:
    """One run x mode: the figures of the module docstring and its verdict."""
    row = {"run": run.name, "client": run.client, "workload": run.workload, "mode": mode,
           "dir": str(cell)}
    stats_path = cell / "gateway-stats.json"
    if not stats_path.exists():
        err = cell / "error.txt"
        row["problems"] = [err.read_text().strip() if err.exists()
                           else "no gateway-stats.json (the run did not finish)"]
        row["passed"] = False
        return row
    stats = json.loads(stats_path.read_text())
    theirs = stats.get("client_ttft") or {}
    row.update({k: stats.get(k) for k in ("requests", "completed", "verified", "pipelines",
                                          "client_exit")})
    row["mismatched"] = len(stats.get("mismatched") or [])
    for q in ("p50", "p90"):
        row[f"client_{q}_ms"] = _ms(theirs.get(f"{q}_s"))
        row[f"gateway_{q}_ms"] = _ms(stats.get(f"ttft_http_s_{q}"))
        row[f"roles_{q}_ms"] = _ms(stats.get(f"ttft_s_{q}"))
        ratio = stats.get(f"client_over_ttft_http_s_{q}")
        row[f"client_over_gateway_{q}"] = ratio
    row["per_request"] = per_request(cell, run.client)
    problems = []
    if row["client_exit"] != 0:
        problems.append(f"the client exited {row['client_exit']}")
    if not row["requests"] or row["completed"] != row["requests"]:
        problems.append(f"{row['completed']} of {row['requests']} requests completed")
    if row["mismatched"] or row["verified"] != row["completed"]:
        problems.append(f"{row['verified']} of {row['completed']} verified against greedy "
                        f"decode, {row['mismatched']} differ")
    for q in ("p50", "p90"):
        ratio = row[f"client_over_gateway_{q}"]
        if ratio is None:
            problems.append(f"no client TTFT {q} (its summary file was not found)")
        elif abs(ratio - 1) > TOLERANCE:
            problems.append(f"client TTFT {q} {ratio:.4f}x the gateway's "
                            f"(tolerance {TOLERANCE:.0%})")
    pr = row["per_request"]
    if pr is not None and pr["tokens_exact"] != pr["matched"]:
        problems.append(f"the client counted the delivered tokens of {pr['tokens_exact']} "
                        f"of {pr['matched']} requests")
    row["problems"], row["passed"] = problems, not problems
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 1)


def clients_doc(out: Path, runs: Sequence[ClientRun], modes: Sequence[str]) -> dict:
    rows = [cell_row(out / run.name / mode, run, mode) for run in runs for mode in modes]
    ratios = [r[f"client_over_gateway_{q}"] for r in rows for q in ("p50", "p90")
              if r.get(f"client_over_gateway_{q}") is not None]
    return {"tolerance": TOLERANCE, "rows": rows, "passed": all(r["passed"] for r in rows),
            "max_deviation": round(max((abs(x - 1) for x in ratios), default=0.0), 4),
            "median_ratio": round(statistics.median(ratios), 4) if ratios else None}


def _f(x, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def clients_md(doc: dict) -> str:
    lines = ["# External benchmark clients vs the gateway's records", "",
             "TTFT in ms. gateway: HTTP request received -> token 0 written; roles: REQUEST "
             "sent -> token 0 back; client/gw: the client's figure over the gateway's. "
             "Per request: the client's TTFT minus the gateway's (ms), and the requests whose "
             "output the client counted as the tokens the roles delivered.", "",
             "| run | mode | completed / verified | pipelines | client p50 | gateway p50 | "
             "roles p50 | client/gw p50 | client p90 | gateway p90 | roles p90 | "
             "client/gw p90 | per request min / p50 / p90 / max ms | tokens exact | passed |",
             "|" + "---|" * 15]
    for r in doc["rows"]:
        pr = r.get("per_request")
        per = "-" if pr is None else " / ".join(f"{pr['delta_ms_' + q]:.2f}"
                                                for q in ("min", "p50", "p90", "max"))
        exact = "-" if pr is None else f"{pr['tokens_exact']} of {pr['matched']}"
        pipes = ", ".join(f"{k} {v}" for k, v in sorted((r.get("pipelines") or {}).items()))
        lines.append(
            f"| {r['run']} | {r['mode']} | {_f(r.get('completed'), '{}')} / "
            f"{_f(r.get('verified'), '{}')} of {_f(r.get('requests'), '{}')} | {pipes or '-'} | "
            + " | ".join(_f(r.get(k)) if not k.startswith("client_over") else
                         _f(r.get(k), "{:.4f}")
                         for k in ("client_p50_ms", "gateway_p50_ms", "roles_p50_ms",
                                   "client_over_gateway_p50", "client_p90_ms",
                                   "gateway_p90_ms", "roles_p90_ms", "client_over_gateway_p90"))
            + f" | {per} | {exact} | {'yes' if r['passed'] else 'NO'} |")
    lines += ["", f"Every cell within {doc['tolerance']:.0%} of the gateway at p50 and p90: "
              f"{'yes' if doc['passed'] else 'no'} (largest deviation "
              f"{doc['max_deviation']:.2%})."]
    failed = [r for r in doc["rows"] if not r["passed"]]
    if failed:
        lines += ["", "## Failed"] + [f"- {r['run']} / {r['mode']}: " + "; ".join(r["problems"])
                                      for r in failed]
    return "\n".join(lines) + "\n"


def selected(only: Sequence[str]) -> list[ClientRun]:
    """The runs named by ``--only`` (all when none), TestbedError for an unknown name."""
    for name in only:
        if name not in RUNS:
            raise TestbedError(f"--only {name}: no such client run (known: "
                               f"{', '.join(RUNS)})")
    return [r for name, r in RUNS.items() if not only or name in only]


def default_paths() -> dict[str, str]:
    """The clients' executables in their own virtualenvs at the repository's top."""
    return {"aiperf": os.fspath(REPO / ".venv-bench" / "bin" / "aiperf"),
            "guidellm": os.fspath(REPO / ".venv-guidellm" / "bin" / "guidellm")}
