"""The exported cluster config runs unchanged on loopback role processes: the roles do
not know where they run.

The quickstart export's ``cluster.json`` (instances at Service DNS names, k = 1) is
mapped to 127.0.0.1 with free ports (``loopback_config``: nothing else changes), the
server roles start as ``python -m testbed.pdd.run.node`` processes, and the client runs
as in the exported Job (``python -m testbed.export.inpod client``: /ready, then the
replay on POST /start). Every request completes with exact tokens; ``collect`` turns
the results into a run directory that ``testbed report`` reads.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from http_fixtures import http_status

from testbed.export.build import ExportOptions, build_export
from testbed.export.collect import collect
from testbed.export.write import run_metadata, write_export
from testbed.pdd.run.config import config_to_dict, parse_config
from testbed.pdd.run.procs import RoleProcesses, free_port, loopback_config
from testbed.pdd.run.verify import verify_records
from testbed.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def _without_addresses(cfg) -> dict:
    d = config_to_dict(cfg)
    d["instances"] = [{k: v for k, v in i.items() if k not in ("host", "port")}
                      for i in d["instances"]]
    return d


def _until(url: str, method: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while http_status(url, method) != 200:
        assert time.monotonic() < deadline, f"{method} {url} not 200 after {timeout_s} s"
        time.sleep(0.2)


def test_exported_config_serves_a_small_workload_on_loopback_with_exact_tokens(tmp_path):
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    exp = build_export(sc)
    mode = exp.modes[0]
    cm = dict(mode.files)["10-config.yaml"][0]
    exported = parse_config(json.loads(cm["data"]["cluster.json"]), "cluster.json")
    cfg = loopback_config(exported)
    assert _without_addresses(cfg) == _without_addresses(exported)
    rng = random.Random(5)
    lines = [{"id": 100, "arrival_s": 0.0, "max_out": 4, "session": 0, "warmup": True,
              "prompt": [rng.randrange(512) for _ in range(16)]}]
    lines += [{"id": i, "arrival_s": 0.2 * i, "max_out": 12, "session": i,
               "prompt": [rng.randrange(512) for _ in range(16 + 8 * i)]} for i in range(3)]
    workload, results = tmp_path / "workload.jsonl", tmp_path / "results"
    workload.write_text("".join(json.dumps(x) + "\n" for x in lines))
    port = free_port()
    with RoleProcesses(cfg, tmp_path / "roles") as procs:
        procs.start()
        with open(tmp_path / "client.log", "wb") as log:
            client = subprocess.Popen(
                [sys.executable, "-m", "testbed.export.inpod", "client", str(procs.config_path),
                 "client", "--workload", str(workload), "--results", str(results),
                 "--port", str(port), "--linger-s", "0", "--wait", "tcp"],  # roles: RoleProcesses
                stderr=log, start_new_session=True)
        try:
            assert http_status(f"http://127.0.0.1:{port}/start", "POST") in (0, 503)  # not before ready
            _until(f"http://127.0.0.1:{port}/ready", "GET", 120)
            assert http_status(f"http://127.0.0.1:{port}/start", "POST") == 200
            assert client.wait(timeout=180) == 0, (tmp_path / "client.log").read_text()[-2000:]
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
    records = [json.loads(x) for x in (results / "requests.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["completed"] * 3, [r.get("reason") for r in records]
    assert all(v.match for v in verify_records(records, cfg.model))
    warm = [json.loads(x) for x in (results / "warmup.jsonl").read_text().splitlines()]
    assert [(r["id"], r["status"]) for r in warm] == [(100, "completed")]
    timing = json.loads((results / "client.json").read_text())
    assert timing["t_ready_mono"] <= timing["t_start_mono"] < timing["t_end_mono"]
    assert all(r["t_sent"] >= timing["t_start_mono"] for r in records)

    export_dir, run_dir = tmp_path / "export", tmp_path / "run"
    write_export(exp, export_dir, run_metadata(sc, ExportOptions()))
    (export_dir / "pdd" / "results").mkdir()
    for name in ("requests.jsonl", "warmup.jsonl", "client.json"):
        (export_dir / "pdd" / "results" / name).write_bytes((results / name).read_bytes())
    assert collect(export_dir, run_dir) == {"pdd": {"checked": 3, "mismatched": []}}
    from testbed.report import build_report

    summary = build_report(run_dir)
    assert summary["modes"]["pdd"]["requests_completed"] == 3
    assert summary["modes"]["pdd"]["tokens_lost"] == 0
    # cross-dc-pd did not run: its expectations are listed, not checked
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert "baseline completes too" in meta["expectations_not_checked"]
