"""An external benchmark client's own TTFT figures, set beside the gateway's.

``client_ttft(folder)`` finds what a known client wrote under ``folder`` and
returns its TTFT p50/p90 in seconds with where they came from:

- AIPerf: ``profile_export_aiperf.json`` (its summary; the metric
  ``time_to_first_token`` with ``unit`` and percentiles ``p50``, ``p90``);
- GuideLLM: a JSON report with ``benchmarks`` (the first benchmark's
  ``metrics.time_to_first_token_ms.successful.percentiles``).

``agreement(stats, client)`` is the client's figure over the gateway's,
per percentile, for both of the gateway's clocks (``ttft_http_s``: HTTP
request received -> token 0 written, the closest to what the client sees;
``ttft_s``: the roles' record, REQUEST sent -> token 0 back).
None when nothing known was found (the caller says so; no figure is made up).
"""

from __future__ import annotations

import json
from pathlib import Path

UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


def _aiperf(path: Path) -> dict | None:
    metric = json.loads(path.read_text()).get("time_to_first_token")
    if not isinstance(metric, dict) or metric.get("unit") not in UNIT_S:
        return None
    scale = UNIT_S[metric["unit"]]
    if not all(isinstance(metric.get(q), (int, float)) for q in ("p50", "p90")):
        return None
    return {"client": "aiperf", "file": str(path), "p50_s": metric["p50"] * scale,
            "p90_s": metric["p90"] * scale}


def _guidellm(path: Path) -> dict | None:
    doc = json.loads(path.read_text())
    try:
        pct = doc["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"][
            "percentiles"]
        p50, p90 = float(pct["p50"]), float(pct["p90"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return {"client": "guidellm", "file": str(path), "p50_s": p50 / 1e3, "p90_s": p90 / 1e3}


def client_ttft(folder: Path) -> dict | None:
    """The first known client summary under ``folder`` (AIPerf first), else None."""
    for path in sorted(folder.rglob("profile_export_aiperf.json")):
        found = _aiperf(path)
        if found:
            return found
    for path in sorted(folder.rglob("*.json")):
        if path.name in ("gateway-stats.json", "verify.json", "cluster.json", "serve.json"):
            continue
        try:
            found = _guidellm(path)
        except (ValueError, OSError):
            continue
        if found:
            return found
    return None


def agreement(stats: dict, client: dict) -> dict:
    """client / gateway per percentile, for ``ttft_http_s`` and ``ttft_s`` (None where the
    gateway has no figure)."""
    out = {}
    for key in ("ttft_http_s", "ttft_s"):
        for q in ("p50", "p90"):
            ours = stats.get(f"{key}_{q}")
            out[f"client_over_{key}_{q}"] = (round(client[f"{q}_s"] / ours, 4)
                                              if ours else None)
    return out
