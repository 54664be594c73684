"""How evenly a mode spread its work over the instances of each role.

Owns ``instance_roles`` (MODE/cluster.json's instances as name -> role),
``balance`` (per instance: requests, output tokens, busy share, peak queue;
per role: the imbalance, max over mean) and ``imbalance``. Input is the
mode's request records (docs/pdd-roles.md, "What the client records": the
router's decision record, testbed/decision.py, names each role's instance in
``instances``; P's and the decoders'
times are on the one machine's monotonic clock) and the workload window.
Pure: nothing here reads files.

Per instance (a role of ``cluster.json``; one that served nothing is a row
of zeros, so it counts in the mean):

- ``requests``: requests the router placed on it (the decision's
  ``instances``);
- ``tokens``: output tokens it produced (a token's producer is its role, so a
  request's ``MD`` tokens are its MD instance's);
- ``busy_share``: of the workload window, the time it was working on at
  least one request: P from its prefill's start (its REPORT's
  ``t_prefill_end`` minus the paced ``prefill_modeled_s``) to its end, a
  decoder from the first to the last token it produced for a request;
- ``peak_queue``: P: the most requests waiting for it at once (routed,
  prefill not started: P's ``queue_s`` before the start); a decoder: the
  most requests it held at once (routed to it and not yet ended: waiting
  for their KV or decoding).

``imbalance`` of a role: the largest instance's requests over the mean
over all its instances (1.0: even; with n instances, n: one took all);
None with fewer than two instances or no requests. ``md_imbalance`` and
``p_imbalance`` in summary.json are the MAIN_DECODE and PREFILL figures.

Example::

    b = balance(records, {"md1": "MAIN_DECODE", "md2": "MAIN_DECODE"}, (t0, t1))
    b["imbalance"]["MAIN_DECODE"], b["instances"][0]["busy_share"]
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

ROLES = ("PREFILL", "RELAY_DECODE", "MAIN_DECODE")
PRODUCER = {"PREFILL": "P", "RELAY_DECODE": "RLD", "MAIN_DECODE": "MD"}
_CONFIG_ROLE = {"prefill": "PREFILL", "relay_decode": "RELAY_DECODE",
                "main_decode": "MAIN_DECODE"}


def instance_roles(cluster: Mapping) -> dict[str, str]:
    """{instance name: role} of the serving instances in a cluster.json object."""
    out = {}
    for inst in cluster.get("instances") or ():
        role = _CONFIG_ROLE.get(str(inst.get("role")))
        if role is not None and inst.get("name"):
            out[str(inst["name"])] = role
    return out


def _union_s(intervals: Iterable[tuple[float, float]], window: tuple[float, float]) -> float:
    """Seconds of ``window`` covered by at least one interval."""
    lo, hi = window
    total, end = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= a or b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _peak(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals open at one time (an interval ending as another starts: not
    both)."""
    edges = sorted([(a, 1) for a, b in intervals if b > a] + [(b, -1) for a, b in intervals
                                                               if b > a], key=lambda e: (e[0],
                                                                                         e[1]))
    peak = n = 0
    for _, step in edges:
        n += step
        peak = max(peak, n)
    return peak


def token_times(record: Mapping, producer: str) -> list[float]:
    """Arrival times (monotonic) of the tokens ``producer`` made for ``record``."""
    t0 = record.get("t_sent")
    if t0 is None:
        return []
    return [t0 + tok[2] for tok in record.get("tokens") or ()
            if len(tok) >= 4 and tok[3] == producer and isinstance(tok[2], (int, float))]


def balance(records: Sequence[Mapping], instances: Mapping[str, str],
            window: tuple[float, float] | None) -> dict:
    """{"instances": [{name, role, requests, tokens, busy_share, peak_queue}, ...] in
    role then name order, "imbalance": {role: max/mean requests or None}}."""
    rows = {name: {"name": name, "role": role, "requests": 0, "tokens": 0,
                   "busy_share": None, "peak_queue": 0}
            for name, role in sorted(instances.items(),
                                     key=lambda kv: (ROLES.index(kv[1]), kv[0]))}
    busy: dict[str, list] = {n: [] for n in rows}
    waiting: dict[str, list] = {n: [] for n in rows}
    for rec in records:
        decision = (rec.get("reports") or {}).get("router") or {}
        t_route, placed = decision.get("t_route"), decision.get("instances")
        if not isinstance(t_route, (int, float)) or not isinstance(placed, Mapping):
            continue  # refused before routing, or the router's REPORT never came
        end = (rec["t_sent"] + rec["e2e_s"]) if rec.get("t_sent") is not None \
            and rec.get("e2e_s") is not None else None
        for role, name in placed.items():
            if name not in rows or rows[name]["role"] != role:
                continue
            row = rows[name]
            row["requests"] += 1
            times = token_times(rec, PRODUCER[role])
            row["tokens"] += len(times)
            if role == "PREFILL":
                p = (rec.get("reports") or {}).get("P") or {}
                t_end, run_s = p.get("t_prefill_end"), p.get("prefill_modeled_s")
                if isinstance(t_end, (int, float)) and isinstance(run_s, (int, float)):
                    start = t_end - run_s
                    busy[name].append((start, t_end))
                    waiting[name].append((start - float(p.get("queue_s") or 0.0), start))
            else:
                if times:
                    busy[name].append((min(times), max(times)))
                last = max(times) if times else end
                if last is not None:
                    waiting[name].append((t_route, max(last, end or last)))
    for name, row in rows.items():
        if window is not None and window[1] > window[0]:
            row["busy_share"] = round(_union_s(busy[name], window) / (window[1] - window[0]), 4)
        row["peak_queue"] = _peak(waiting[name])
    out = list(rows.values())
    return {"instances": out, "imbalance": {role: imbalance(r["requests"] for r in out
                                                            if r["role"] == role)
                                            for role in ROLES}}


def imbalance(counts: Iterable[int]) -> float | None:
    """max / mean of ``counts``; None with fewer than two or a zero sum."""
    c = list(counts)
    if len(c) < 2 or sum(c) == 0:
        return None
    return round(max(c) / (sum(c) / len(c)), 4)
