"""``testbed collect``: a cluster run's results, copied out of the pods, as a run directory.

Owns the step from what ``kubectl cp`` copied to what ``testbed report``
reads (docs/run-directory.md). Input, for an export directory DIR
(``testbed export k8s ... --out DIR``), per mode:

    DIR/MODE/results/   the client pod's /results (kubectl cp NS/POD:/results DIR/MODE/results):
                        requests.jsonl, warmup.jsonl (with warm-up), client.json
    DIR/MODE/logs/      optional: NAME.log per role (kubectl logs)

Output RUN_DIR: ``metadata.json`` (the export's, plus when it was
collected), and per mode ``requests.jsonl``, ``warmup.jsonl``,
``cluster.json`` and ``workload.jsonl`` (from the exported ConfigMap),
``events.jsonl`` (``workload_start``/``workload_end`` from client.json,
and the Workflow's planned fault start/end marked ``"planned": true`` -
Chaos Mesh's own timestamps are in the cluster, not here), ``roles/``,
and ``verify.json`` (every request against a single-process greedy
decode, as the runner does). There is no ``links.csv``: the cluster's
byte counters are not collected. This runs without a cluster; it was
tested on results written by the loopback role processes, not on a
cluster's.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import yaml

from testbed.errors import TestbedError
from testbed.types import FaultEvent


class CollectError(TestbedError):
    """The export directory lacks what a run directory needs (names the file)."""


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CollectError(f"{path}: missing")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CollectError(f"{path}: not valid JSON ({e})") from None


def _config_map(mode_dir: Path) -> dict:
    path = mode_dir / "10-config.yaml"
    if not path.is_file():
        raise CollectError(f"{path}: missing (not an export directory?)")
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
            return doc["data"]
    raise CollectError(f"{path}: no ConfigMap")


def _events(client: dict, mode: dict) -> list[dict]:
    t0 = client.get("t_start_mono")
    if t0 is None:
        return []
    out = [{"t_mono": t0, "t_wall": client.get("t_start_wall"), "kind": "workload_start"}]
    for s in mode.get("steps", []):
        if "fault_kind" not in s:
            raise CollectError(f"export.json: mode {mode.get('name')!r}: a fault step without "
                               "fault_kind (written by an older testbed export): export again")
        for edge, at in (("start", s["at_s"]), ("end", s["at_s"] + s["duration_s"])):
            fe = FaultEvent(edge, s["fault"], s["fault_kind"], "wan",
                            {"action": s["action"], "target": s["target"]}, planned=True)
            out.append({"t_mono": t0 + at, **fe.record()})
    if client.get("t_end_mono") is not None:
        out.append({"t_mono": client["t_end_mono"], "kind": "workload_end"})
    return sorted(out, key=lambda e: e["t_mono"])


def _verify(mode_out: Path) -> dict:
    from testbed.pdd.run.config import load_config
    from testbed.pdd.run.verify import verify_records

    records = [json.loads(x) for x in (mode_out / "requests.jsonl").read_text().splitlines()
               if x.strip()]
    verdicts = verify_records(records, load_config(mode_out / "cluster.json").model)
    out = {"checked": len(verdicts),
           "mismatched": [v.id for v in verdicts if not v.prefix_ok
                          or (v.status == "completed" and not v.match)]}
    (mode_out / "verify.json").write_text(json.dumps(out))
    return out


def _only_modes(meta: dict, names: list[str]) -> dict:
    """``meta`` for a run of only ``names``: an expectation on a mode that did not run
    cannot be checked (the report would refuse it), so it moves to
    ``expectations_not_checked``, which ``testbed collect`` prints."""
    meta = dict(meta, modes=names)
    resolved = dict(meta.get("resolved") or {})
    kept, dropped = [], []
    for e in resolved.get("expectations") or []:
        ran = e.get("mode") in names and e.get("baseline", e.get("mode")) in names
        (kept if ran else dropped).append(e)
    if dropped:
        resolved["expectations"] = kept
        meta.update(resolved=resolved, expectations_not_checked=[e["name"] for e in dropped])
    return meta


def collect(export_dir: Path, out: Path) -> dict:
    """Build run directory ``out`` from ``export_dir``; returns {mode: verify result} for
    the modes whose results were copied (a mode not run yet is left out of the run
    directory, and so are the expectations on it; none at all is an error naming where
    the results go)."""
    summary = _read_json(export_dir / "export.json")
    meta = _read_json(export_dir / "metadata.json")
    modes = [m for m in summary["modes"]
             if (export_dir / m["name"] / "results" / "requests.jsonl").is_file()]
    if not modes:
        m = summary["modes"][0]
        raise CollectError(f"{export_dir / m['name'] / 'results' / 'requests.jsonl'}: missing "
                           f"(no mode has results); copy the client's results first: kubectl "
                           f"cp {m['namespace']}/POD:/results {export_dir / m['name'] / 'results'}")
    out.mkdir(parents=True, exist_ok=True)
    meta = _only_modes(meta, [m["name"] for m in modes])
    meta.update(collected_from=str(export_dir),
                collected_wall=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    (out / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n")
    verified = {}
    for mode in modes:
        src, dst = export_dir / mode["name"], out / mode["name"]
        results = src / "results"
        dst.mkdir(parents=True, exist_ok=True)
        for name in ("requests.jsonl", "warmup.jsonl", "client.json"):
            if (results / name).is_file():
                shutil.copyfile(results / name, dst / name)
        data = _config_map(src)
        (dst / "cluster.json").write_text(data["cluster.json"])
        (dst / "workload.jsonl").write_text(data["workload.jsonl"])
        client = _read_json(results / "client.json") if (results / "client.json").is_file() \
            else {}
        events = _events(client, mode)
        (dst / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        if (src / "logs").is_dir():
            (dst / "roles").mkdir(exist_ok=True)
            for log in sorted((src / "logs").glob("*.log")):
                shutil.copyfile(log, dst / "roles" / log.name)
        verified[mode["name"]] = _verify(dst)
    return verified
