"""Every routing decision judged by what the run measured: would the other pipeline have
given the request its first token sooner?

Owns ``hindsight`` (one mode's figures for summary.json, ``decision_regret_share``
among them) and ``judge`` (one request). Input is the mode's request records
(docs/pdd-roles.md, "What the client records"): the router's decision and its
inputs (the router's REPORT), P's prefill end, MD's KV arrival, RLD's first
token, all on one system-wide monotonic clock. Pure: nothing here reads files.

Which decisions are judged: those the pipeline rule made from its predictions
(testbed/pdd/roles/routing.py), recognised by the reason the router recorded.
Each is judged by the rule itself with measured times in place of predicted
ones: the *gain* of relaying is the first token without relaying minus the
first token with it, and the rule relays when the gain reaches
``relay_threshold_s`` (the mode's setting). A decision is *reversed* when the
measured gain falls on the other side of the threshold:

- ``p-md`` because relaying would gain too little ("short transfer"): its
  TTFT is measured; the relayed one is estimated as P's prefill end plus
  the mode's median measured relay overhead (P's prefill end -> RLD's first
  token over its requests RLD emitted for; the router's predicted local
  transfer when RLD emitted for none). Reversed when the gain reaches the
  threshold; cost: the gain, the TTFT relaying would have saved.
- ``p-rld-md`` ("long transfer ...: relay", or "lossy WAN ...: relay": relayed
  on measured loss although the prediction gained too little): its TTFT is measured; the
  direct one is estimated as the KV's measured arrival at MD plus the
  mode's median measured MD first step (the KV at MD -> its first token over
  the mode's p-md requests; 0 when there are none, which favours reversal).
  Reversed when the gain falls short of the threshold; TTFT cost: what the
  relay added, if it added anything (a relay that gained less than the
  threshold still cost RLD's time and the intra-DC bytes).
- ``rld-only`` because the KV would reach MD after RLD's last token ("KV
  would reach MD"): reversed when the router's predicted WAN time was
  shorter than RLD's measured decode (P's prefill end -> the last token):
  MD could have taken over, sparing RLD. The KV never crossed, so its time
  is the prediction; the first token is RLD's either way (TTFT cost 0).

Another policy than the modes' own (``always-relay``, ``prompt-threshold``, a user's
file: the record's ``policy``) is judged by its pipeline: every ``p-md`` and
``p-rld-md`` decision as above, whatever its reason, except warm-up and MD-down
decisions and a ``p-md`` forced by RLD's room or a missing instance (its reason says
so); its ``rld-only`` decisions are not judged.

Not judged: decisions the rule did not make from a prediction (baselines,
warm-up, the anomalous filter, RLD full, MD down, p-rld's all-RLD branch),
requests that failed or were re-served, and records missing a time. The
estimates are medians of the same run's measurements: a reversal whose gain
is near the threshold is uncertain, which is why the costs' p50 and max are
reported beside the count.

Placements (``placement_hindsight``, summary.json ``hindsight.placement``): each
MD a ``p-md`` request was placed on, against the other MD candidates the router
recorded, with the run's measured KV waits and per-token times (its docstring
says how). P and RLD placements are not judged.

Example::

    h = hindsight(records, relay_threshold_s=0.5)
    h["decision_regret_share"], h["reversed"], h["worst"][0]["cost_s"]
"""

from __future__ import annotations

from statistics import median
from typing import Iterable, Mapping, Sequence

from testbed.decision import Decision
from testbed.report.balance import token_times

WORST_N = 10
# the reasons of the modes' own rules (testbed/pdd/policy/pdd.py, p_rld.py) that hindsight
# judges
_SHORT, _LATE = "short transfer", "KV would reach MD"
_RELAY = ("long transfer (", "lossy WAN (")  # relayed on the prediction, or on measured loss
_MODE_POLICIES = ("", "pdd", "cross-dc-pd", "same-dc-pd", "p-rld")
# decisions of any other policy that no policy makes from a prediction (base.guard; RLD's
# room or no live instance forcing p-md)
_NOT_JUDGED = ("warm-up", "MAIN_DECODE down")
_FORCED = ("RLD full", "no live ")


def _report(record: Mapping, role: str) -> Mapping:
    return (record.get("reports") or {}).get(role) or {}


def kind(record: Mapping) -> str | None:
    """Which judged decision a record holds (``p-md``, ``p-rld-md``, ``rld-only``), or
    None when hindsight does not judge it (see the module docstring)."""
    d = Decision.of_record(record)
    if d is None or d.routing is None or record.get("status") != "completed" or d.reserves:
        return None
    reason, pipeline = d.reason, d.pipeline
    if d.routing.policy not in _MODE_POLICIES:  # another policy: by pipeline
        if reason.startswith(_NOT_JUDGED) or any(f in reason for f in _FORCED):
            return None
        return pipeline if pipeline in ("p-md", "p-rld-md") else None
    if pipeline == "p-md" and reason.startswith(_SHORT):
        return "p-md"
    if pipeline == "p-rld-md" and reason.startswith(_RELAY) and reason.endswith(": relay"):
        return "p-rld-md"
    if pipeline == "rld-only" and reason.startswith(_LATE):
        return "rld-only"
    return None


def _first_token_at(record: Mapping) -> float | None:
    t_sent, ttft = record.get("t_sent"), record.get("ttft_s")
    return None if t_sent is None or ttft is None else t_sent + ttft


def estimates(records: Sequence[Mapping]) -> dict:
    """The mode's measured medians the counterfactuals use (None when it has none):
    ``relay_overhead_s`` (P's prefill end -> RLD's first token, every completed request
    RLD emitted for: relayed and rld-only take the same local path) and
    ``md_first_step_s`` (KV at MD -> MD's first token, p-md requests)."""
    relay = [r["relay_overhead_ms"] / 1000 for r in records
             if r.get("status") == "completed" and r.get("relay_overhead_ms") is not None]
    md_first = []
    for r in records:
        done, first = _report(r, "MD").get("t_kv_done"), _first_token_at(r)
        if kind(r) == "p-md" and done is not None and first is not None:
            md_first.append(max(0.0, first - done))
    return {"relay_overhead_s": median(relay) if relay else None,
            "relay_overhead_n": len(relay),
            "md_first_step_s": median(md_first) if md_first else None,
            "md_first_step_n": len(md_first)}


def judge(record: Mapping, est: Mapping, relay_threshold_s: float) -> dict | None:
    """One decision in hindsight: {id, pipeline, reason, ttft_s, other_ttft_s, gain_s,
    reversed, cost_s, inputs}; None when not judged or a time is missing."""
    k = kind(record)
    if k is None:
        return None
    routing, t_sent = Decision.of_record(record).routing, record.get("t_sent")
    p_end = _report(record, "P").get("t_prefill_end")
    kv_done = _report(record, "MD").get("t_kv_done")
    first = _first_token_at(record)
    if t_sent is None or p_end is None or first is None:
        return None
    ttft = first - t_sent
    if k == "p-md":
        overhead = est.get("relay_overhead_s")
        if overhead is None:
            overhead = routing.predicted_local_s
        other = p_end + overhead - t_sent
        gain = ttft - other
        reversed_, cost = gain >= relay_threshold_s, max(0.0, gain)
    elif k == "p-rld-md":
        if kv_done is None:
            return None
        other = kv_done + (est.get("md_first_step_s") or 0.0) - t_sent
        gain = other - ttft
        reversed_, cost = gain < relay_threshold_s, max(0.0, -gain)
    else:  # rld-only: the KV's time is the router's prediction; TTFT is RLD's either way
        wan_s, e2e = routing.late_kv_wan_s, record.get("e2e_s")
        if e2e is None:
            return None
        other, gain = ttft, None
        reversed_, cost = wan_s < t_sent + e2e - p_end, 0.0
    return {"id": record.get("id"), "pipeline": k, "reason": Decision.of_record(record).reason,
            "ttft_s": round(ttft, 4), "other_ttft_s": round(other, 4),
            "gain_s": None if gain is None else round(gain, 4),
            "reversed": bool(reversed_), "cost_s": round(cost if reversed_ else 0.0, 4),
            "inputs": {key: getattr(routing, key) for key in
                       ("predicted_wan_s", "wan_margin_s", "predicted_local_s",
                        "wan_gbit", "wan_backlog_bytes", "late_kv_wan_s",
                        "wan_retrans_share")}
            | {"actual_wan_s": (record.get("kv_at_md") or {}).get("actual_wan_s"),
               "relay_overhead_ms": record.get("relay_overhead_ms")}}


def hindsight(records: Sequence[Mapping], relay_threshold_s: float) -> dict:
    """One mode's hindsight figures (summary.json ``hindsight``; see the module
    docstring). ``decision_regret_share`` is None when no decision was judged."""
    est = estimates(records)
    verdicts = [v for v in (judge(r, est, relay_threshold_s) for r in records)
                if v is not None]
    rev = [v for v in verdicts if v["reversed"]]
    costs = sorted(v["cost_s"] for v in rev)
    by_pipeline = {}
    for k in ("p-md", "p-rld-md", "rld-only"):
        vs = [v for v in verdicts if v["pipeline"] == k]
        if vs:
            by_pipeline[k] = {"judged": len(vs), "reversed": sum(v["reversed"] for v in vs),
                              "cost_s": round(sum(v["cost_s"] for v in vs if v["reversed"]), 4)}
    return {
        "relay_threshold_s": relay_threshold_s,
        "judged": len(verdicts), "reversed": len(rev),
        "decision_regret_share": len(rev) / len(verdicts) if verdicts else None,
        "cost_s_total": round(sum(costs), 4),
        "cost_s_p50": round(median(costs), 4) if costs else None,
        "cost_s_max": costs[-1] if costs else None,
        "by_pipeline": by_pipeline,
        "estimates": est,
        "worst": _worst(rev),
        "placement": placement_hindsight(records, relay_threshold_s),
    }


def _worst(reversed_: Iterable[dict]) -> list[dict]:
    return sorted(reversed_, key=lambda v: (-v["cost_s"], str(v["id"])))[:WORST_N]


# -- placements -------------------------------------------------------------------------
def _md_tokens(record: Mapping) -> list[float]:
    return sorted(token_times(record, "MD"))


def _tpot(times: Sequence[float]) -> float | None:
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def placement_hindsight(records: Sequence[Mapping], threshold_s: float) -> dict:
    """Each MD placement of a completed ``p-md`` request judged by the run's measured
    times: would another MD candidate have finished it sooner?

    The request's measured path: P's prefill end, the KV at its MD (``t_kv_done``), MD's
    first token, its tokens at its measured per-token time. On another candidate (the
    decision record's ``placement``: what each held of the prompt): the KV wait scaled by
    the prompt it lacked (``(n - held_other) / (n - held_chosen)``; the router's predicted
    transfer difference when the chosen one held it all), the same first step, and that
    MD's per-token time then: the median over its requests decoding at the same time
    (measured), or, when it decoded none, the mode's fastest measured per-token time (an
    idle decoder's). Reversed when another would have finished at least ``threshold_s``
    (the mode's ``relay_threshold_s``) sooner; cost: that gain. Not judged: one MD,
    requests re-served, relayed or rld-only (RLD's tokens set their pace), records made
    before decisions carried their candidates."""
    spans: dict[str, list[tuple[float, float, float]]] = {}
    for r in records:
        d = Decision.of_record(r)
        times = _md_tokens(r)
        md = d.instances.get("MAIN_DECODE") if d is not None else None
        if md is not None and (tp := _tpot(times)) is not None:
            spans.setdefault(md, []).append((times[0], times[-1], tp))
    fastest = min((tp for v in spans.values() for _, _, tp in v), default=None)
    verdicts = []
    for r in records:
        d = Decision.of_record(r)
        if (d is None or d.routing is None or d.reserves or r.get("status") != "completed"
                or d.pipeline != "p-md"):
            continue
        cands = d.placement.get("MAIN_DECODE") or {}
        chosen = d.instances.get("MAIN_DECODE")
        p_end = _report(r, "P").get("t_prefill_end")
        kv_done = _report(r, "MD").get("t_kv_done")
        times = _md_tokens(r)
        tpot = _tpot(times)
        if chosen not in cands or len(cands) < 2 or None in (p_end, kv_done, tpot):
            continue
        n, mine = int(r.get("prompt_len") or 0), cands[chosen]
        wait, first_step, finish = kv_done - p_end, times[0] - kv_done, times[-1]
        best = None
        for name, c in cands.items():
            if name == chosen:
                continue
            if n > mine["held_tokens"]:
                wait_o = wait * (n - c["held_tokens"]) / (n - mine["held_tokens"])
            else:
                wait_o = wait + c["transfer_s"] - mine["transfer_s"]
            during = [tp for a, b, tp in spans.get(name, ()) if a < finish and b > times[0]]
            tpot_o = median(during) if during else fastest
            other = p_end + wait_o + first_step + (len(times) - 1) * tpot_o
            if best is None or other < best[1]:
                best = (name, other)
        gain = finish - best[1]
        verdicts.append({"id": r.get("id"), "md": chosen, "other_md": best[0],
                         "finish_s": round(finish - r["t_sent"], 4),
                         "other_finish_s": round(best[1] - r["t_sent"], 4),
                         "gain_s": round(gain, 4), "reversed": gain >= threshold_s,
                         "cost_s": round(gain, 4) if gain >= threshold_s else 0.0,
                         "held_tokens": int(mine["held_tokens"]),
                         "other_held_tokens": int(cands[best[0]]["held_tokens"])})
    rev = [v for v in verdicts if v["reversed"]]
    return {"judged": len(verdicts), "reversed": len(rev),
            "regret_share": len(rev) / len(verdicts) if verdicts else None,
            "cost_s_total": round(sum(v["cost_s"] for v in rev), 4),
            "worst": sorted(rev, key=lambda v: (-v["cost_s"], str(v["id"])))[:WORST_N]}
