"""`testbed reproduce`: every claim's figure and verdict from canned run directories.

The run directories are written here with the fields docs/run-directory.md and
docs/pdd-roles.md document (metadata.json, MODE/requests.jsonl, MODE/events.jsonl),
small enough that each figure can be worked out by hand.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testbed.decision import Decision, Routing
from testbed.cli import main
from testbed.errors import EmulationError
from testbed.report.claims import (DIFFERS, NOT_HERE, REPRODUCED, claim_baseline_tail,
                                   claim_handoff_bench, claim_rld_share, claim_ttft,
                                   claim_wan_bytes, magnitude_verdict)
from testbed.report.claims_load import (claim_bathtub, claim_bcr, claim_filter, claim_goodput,
                                        claim_handoff_modes, claim_p_rld, handoff_spikes,
                                        rld_peak_hold)
from testbed.report.rundir import ModeData
from testbed.report.reproduce import (BENCH_FILE, FULL, QUICK, REPO, build_table, load_runs,
                                      reproduce, run_slots)
from testbed.spec.scenario import load_scenario

PDD = {"token_scale": 32, "time_scale": 0.5, "kv_bytes_per_token": 50000,
       "handoff_mode": "catch-up", "anomalous_filter": True, "late_kv_local": True,
       "anomalous_min_input_tokens": 65536, "anomalous_max_output_tokens": 500}
WAN = {"a_to_b": {"rate_gbit": 10.0, "delay_ms": 20.0}, "b_to_a": {"rate_gbit": 10.0,
                                                                    "delay_ms": 20.0}}


def rec(i, ttft, *, n_tok=16, rld=0, tok_s=0.05, hit=0.95, prompt=100, max_out=16,
        kv_wan=0, arrival=None, pipeline="p-md", stall=None, reason="", status="completed",
        gap_at_handoff=None):
    """A request record; its first ``rld`` tokens from RLD, the rest from MD."""
    tokens, t = [], ttft
    for p in range(n_tok):
        if p == rld and rld and gap_at_handoff is not None:
            t += gap_at_handoff - tok_s
        tokens.append([p, 7, round(t, 6), "rld" if p < rld else "md"])
        t += tok_s
    return {"id": f"r{i}", "status": status, "ttft_s": ttft, "e2e_s": tokens[-1][2],
            "t_sent": float(i), "arrival_s": float(i) if arrival is None else arrival,
            "designed_hit_rate": hit, "prompt_len": prompt, "max_out": max_out,
            "pipeline": pipeline, "tokens": tokens, "tokens_lost": 0, "tokens_duplicated": 0,
            "bytes": {"kv_wan": kv_wan, "kv_intra": 0, "handoff": 0},
            "handoff": {"stall_ms": stall}, "md_hit_rate": hit,
            "kv_at_md": {"actual_wan_s": 0.5, "predicted_wan_s": 0.4},
            "reports": {"router": decision(pipeline, reason)}}


def decision(pipeline="p-md", reason="", instances=None, **routing) -> dict:
    """The router's decision record as the router writes it (testbed/decision.py)."""
    fields = {f: 0 for f in Routing.__dataclass_fields__} | {"policy": "pdd"} | routing
    return Decision(pipeline, reason, "pdd", ("MAIN_DECODE", "PREFILL"), instances or {},
                    Routing(**fields)).data()


def write_run(root: Path, slot: str, modes: dict, *, scale=10.0, sla=None) -> Path:
    """modes: {name: (kind, pdd overrides, records, workload span s)}"""
    d = root / slot
    d.mkdir(parents=True)
    resolved = {"name": slot, "pdd": PDD, "sla": sla or {"ttft_s": 1.0, "tpot_ms": 200.0},
                "modes": [{"name": n, "mode": k, "pdd": {**PDD, **o}}
                          for n, (k, o, _, _) in modes.items()]}
    (d / "metadata.json").write_text(json.dumps({
        "scenario": slot, "scale": scale, "backend": "netem", "resolved": resolved,
        "topology": {"wan": WAN}, "modes": list(modes)}))
    for name, (_, _, records, span) in modes.items():
        (d / name).mkdir()
        (d / name / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (d / name / "events.jsonl").write_text(
            json.dumps({"t_mono": 100.0, "kind": "workload_start"}) + "\n"
            + json.dumps({"t_mono": 100.0 + span, "kind": "workload_end"}) + "\n")
    return d


HITS = (0.5, 0.925, 0.995)  # three of the paper's seven bins


def runs_of(root: Path) -> dict:
    return load_runs(root)[0]


def headline(root: Path, pdd_ttft=0.5, base_ttft=1.0, prld_e2e_extra=0.0) -> Path:
    """20 requests: 1 of 16 tokens from RLD in pdd; 10x smaller WAN KV than the prompts
    (100 tokens x 32 x 50 KB = 160 MB nominal each; 1.6 MB emulated x k=10 sent)."""
    def mode(ttft, **kw):
        return [rec(i, ttft, kv_wan=1_600_000, hit=HITS[i % 3], **kw) for i in range(20)]

    prld = [rec(i, pdd_ttft, tok_s=0.05 + prld_e2e_extra) for i in range(20)]
    return write_run(root, "headline", {
        "pdd": ("pdd", {}, mode(pdd_ttft, rld=1), 20.0),
        "cross-dc-pd": ("cross-dc-pd", {}, mode(base_ttft), 20.0),
        "same-dc-pd": ("same-dc-pd", {}, mode(pdd_ttft), 20.0),
        "p-rld": ("p-rld", {}, prld, 20.0)})


def test_the_conditions_say_which_engine_made_the_tokens(tmp_path):
    from testbed.report.claims import conditions

    modes = {"pdd": ("pdd", {}, [rec(0, 0.5)], 1.0),
             "pdd-hash": ("pdd", {"engine": "hash"}, [rec(0, 0.5)], 1.0)}
    write_run(tmp_path, "x", modes)
    data = next(iter(runs_of(tmp_path).values()))
    assert conditions(data, "pdd")["model"].endswith("tokens from the tiny model")
    assert conditions(data, "pdd-hash")["model"].endswith("tokens from the hash engine")


def test_verdict_rule_is_half_a_decade():
    assert magnitude_verdict(-51.5, -20.0)[0] == REPRODUCED   # 2.6x smaller
    assert magnitude_verdict(-51.5, -15.0)[0] == DIFFERS      # 3.4x smaller
    assert magnitude_verdict(-51.5, 10.0)[0] == DIFFERS       # the wrong way
    assert "opposite" in magnitude_verdict(27.8, -7.0)[1]
    assert magnitude_verdict(0.062, None)[0] == NOT_HERE


def test_ttft_claim(tmp_path):
    headline(tmp_path / "a", pdd_ttft=0.5, base_ttft=1.0)
    c = claim_ttft(runs_of(tmp_path / "a"), None)
    assert c.figures["mean_change_pct"] == pytest.approx(-50.0)
    assert c.figures["p90_change_pct"] == pytest.approx(-50.0)
    assert c.verdict == REPRODUCED
    assert c.conditions["k"] == 10.0 and c.conditions["token_scale"] == 32
    assert c.conditions["context_tokens_p50"] == 3200 and "40 ms" in c.conditions["wan"]
    headline(tmp_path / "b", pdd_ttft=1.1, base_ttft=1.0)
    c = claim_ttft(runs_of(tmp_path / "b"), None)
    assert c.verdict == DIFFERS and "opposite" in c.reason


def test_baseline_tail_prefers_its_own_run(tmp_path):
    headline(tmp_path, base_ttft=1.0)
    c = claim_baseline_tail(runs_of(tmp_path), None)
    assert c.verdict == DIFFERS and c.figures["ttft_p50_s"] == pytest.approx(1.0)
    assert "headline" in c.conditions["note"]
    write_run(tmp_path, "baseline-64k", {"cross-dc-pd": (
        "cross-dc-pd", {}, [rec(i, 10.0, prompt=2048) for i in range(10)], 10.0)})
    c = claim_baseline_tail(runs_of(tmp_path), None)
    # 10 s against 4.2 / 18.3 / 29.7: 2.4x, 0.55x, 0.34x - all within half a decade
    assert c.verdict == REPRODUCED and c.conditions["context_tokens_p50"] == 65536
    assert c.figures["kv_transfer_max_s"] == pytest.approx(0.5)
    # the differing one explains the gap with the line: 65536 x 50 KB at 10 Gbit/s
    c = claim_baseline_tail({"headline": runs_of(tmp_path)["headline"]}, None)
    assert c.figures["full_64k_kv_s"] == pytest.approx(65536 * 50000 * 8 / 10e9)


def test_baseline_tail_prefers_the_fleet_to_the_one_p_run(tmp_path):
    headline(tmp_path, base_ttft=1.0)
    write_run(tmp_path, "baseline-64k", {"cross-dc-pd": (
        "cross-dc-pd", {}, [rec(i, 0.5, prompt=2048) for i in range(10)], 10.0)})
    fleet = [rec(i, 10.0, prompt=2048) for i in range(10)]
    for i, r in enumerate(fleet):  # placed on three P instances
        r["reports"] = {**r.get("reports", {}),
                        "router": decision(instances={"PREFILL": f"p{i % 3 + 1}"})}
    write_run(tmp_path, "fleet", {"cross-dc-pd": ("cross-dc-pd", {}, fleet, 10.0)})
    c = claim_baseline_tail(runs_of(tmp_path), None)
    assert c.figures["ttft_p50_s"] == pytest.approx(10.0) and c.verdict == REPRODUCED
    assert c.conditions["note"] == "the fleet: 3 P share one WAN line"


def test_the_load_claims_prefer_the_fleet_sweep(tmp_path):
    headline(tmp_path)
    loads = {}
    for n in (10, 20):  # 1 and 2 req/s over the 10 s span
        for kind, name in (("pdd", "pdd"), ("cross-dc-pd", "base"), ("same-dc-pd", "same"),
                           ("p-rld", "prld")):
            loads[f"{name}-n{n}"] = (kind, {}, [rec(i, 0.1) for i in range(n)], 10.0)
    write_run(tmp_path, "fleet-sweep", loads)
    c = claim_goodput(runs_of(tmp_path), None)
    assert c.conditions and len(c.figures["points"]["pdd"]) == 2
    assert c.figures["pdd_knee"][2] == "pdd-n20"  # the sweep's, not the headline's
    assert len(claim_p_rld(runs_of(tmp_path), None).figures["points"]) == 2


def test_wan_bytes_counterfactual(tmp_path):
    headline(tmp_path)
    c = claim_wan_bytes(runs_of(tmp_path), None)
    assert c.figures["full_kv_bytes"] == 20 * 100 * 32 * 50000
    assert c.figures["wan_kv_bytes"] == 20 * 1_600_000 * 10
    assert c.figures["reduction_x"] == pytest.approx(10.0)
    assert c.figures["offered_gbit_no_cache"] == pytest.approx(20 * 160e6 * 8 / 20 / 1e9)
    assert c.verdict == NOT_HERE and "drc" in c.reason


def test_a_figure_the_run_did_not_record_is_never_computed_from_a_default(tmp_path):
    """No KV bytes per token, no WAN rate in the run: claim 3 is not reproducible here
    with the field named, claim 2 says what it cannot compute (no 10 Gbit/s, 50 KB)."""
    d = headline(tmp_path)
    meta = json.loads((d / "metadata.json").read_text())
    for m in meta["resolved"]["modes"]:
        m["pdd"].pop("kv_bytes_per_token")
    meta["resolved"]["pdd"].pop("kv_bytes_per_token")
    meta["topology"]["wan"] = {}
    (d / "metadata.json").write_text(json.dumps(meta))
    c = claim_wan_bytes(runs_of(tmp_path), None)
    assert c.verdict == NOT_HERE and "kv_bytes_per_token" in c.reason
    tail = claim_baseline_tail(runs_of(tmp_path), None)
    assert "full_64k_kv_s" not in tail.figures
    assert "records no WAN rate" in tail.reason and "KV bytes per token" in tail.reason
    assert "? (not recorded) B/token" in tail.conditions["model"]
    assert tail.conditions["wan"] == "? Gbit/s, RTT ? ms"


@pytest.mark.parametrize("off_bytes, verdict", [(16_000_000, REPRODUCED), (4_000_000, DIFFERS)])
def test_wan_bytes_measured_with_a_drc_off_mode(tmp_path, off_bytes, verdict):
    """With a cross-dc-pd mode that ran ``drc: false`` the ratio is measured: the same 20
    requests sent 1.6 MB (emulated) each with the DRC and off_bytes without it."""
    recs = [rec(i, 1.0, kv_wan=1_600_000, hit=HITS[i % 3]) for i in range(20)]
    off = [rec(i, 2.0, kv_wan=off_bytes, hit=0.0) for i in range(20)]
    write_run(tmp_path, "headline", {
        "pdd": ("pdd", {}, [rec(i, 0.5, kv_wan=1_600_000, rld=1) for i in range(20)], 20.0),
        "cross-dc-pd": ("cross-dc-pd", {}, recs, 20.0),
        "base-nodrc": ("cross-dc-pd", {"drc": False}, off, 20.0)})
    c = claim_wan_bytes(runs_of(tmp_path), None)
    assert c.figures["drc_off_mode"] == "base-nodrc" and c.figures["same_requests"]
    assert c.figures["wan_kv_bytes_drc_off"] == 20 * off_bytes * 10
    assert c.figures["measured_reduction_x"] == pytest.approx(off_bytes / 1_600_000)
    assert c.verdict == verdict


def test_wan_bytes_prefers_the_wan_bytes_slot_over_the_headline(tmp_path):
    """The full run's headline has no drc: false mode; its wan-bytes slot measures it."""
    headline(tmp_path)
    write_run(tmp_path, "wan-bytes", {
        "cross-dc-pd": ("cross-dc-pd", {}, [rec(i, 1.0, kv_wan=1_600_000) for i in range(20)],
                        20.0),
        "base-nodrc": ("cross-dc-pd", {"drc": False},
                       [rec(i, 2.0, kv_wan=16_000_000, hit=0.0) for i in range(20)], 20.0)})
    c = claim_wan_bytes(runs_of(tmp_path), None)
    assert c.verdict == REPRODUCED and c.figures["measured_reduction_x"] == pytest.approx(10.0)
    assert [s.name for s in FULL][:2] == ["headline", "wan-bytes"]


def test_rld_share(tmp_path):
    headline(tmp_path)
    c = claim_rld_share(runs_of(tmp_path), None)
    assert c.figures["rld_token_share"] == pytest.approx(1 / 16)
    assert c.verdict == REPRODUCED


def bench(kv_mean=185.0, kv_std=60.0, ids_mean=305.0, ids_std=4.8):
    return {"scale": 10, "wan": {"rate_gbit": 10, "rtt_ms": 40, "jitter_ms": 2,
                                 "cross_flows": 4},
            "incremental_kv": {"n": 10, "mean_ms": kv_mean, "max_ms": 500.0, "std_ms": kv_std},
            "token_ids_recompute": {"n": 10, "mean_ms": ids_mean, "max_ms": 320.0,
                                    "std_ms": ids_std}}


def test_handoff_bench_claim():
    assert claim_handoff_bench({}, bench()).verdict == REPRODUCED
    assert claim_handoff_bench({}, bench(ids_std=80.0)).verdict == DIFFERS  # not steadier
    assert claim_handoff_bench({}, bench(kv_mean=18.0)).verdict == DIFFERS
    assert claim_handoff_bench({}, None).verdict == NOT_HERE


def sweep(root: Path, good: dict[str, list[int]]) -> Path:
    """goodput-load: per kind, per load point (0.5, 1, 2 req/s), how many of 10 requests
    meet the SLA (the others miss TTFT); a 10 s workload."""
    modes = {}
    for kind, counts in good.items():
        for load, n_good in zip((0.5, 1.0, 2.0), counts):
            recs = [rec(i, 0.2 if i < n_good else 3.0, arrival=i / load) for i in range(10)]
            modes[f"{kind[:4]}-{int(load * 10):02d}"] = (kind, {}, recs, 10.0)
    return write_run(root, "goodput-load", modes)


def test_goodput_at_the_knee(tmp_path):
    sweep(tmp_path, {"pdd": [5, 9, 6], "cross-dc-pd": [5, 7, 4], "same-dc-pd": [5, 8, 5]})
    c = claim_goodput(runs_of(tmp_path), None)
    assert c.figures["pdd_knee"][1] == pytest.approx(0.9)  # 9 of 10 in 10 s at 1 req/s
    assert c.figures["pdd_knee"][0] == pytest.approx(1.0)
    assert c.figures["change_pct"] == pytest.approx(100 * (9 / 7 - 1))
    assert c.verdict == REPRODUCED


def test_goodput_the_wrong_way_names_the_violations(tmp_path):
    sweep(tmp_path, {"pdd": [5, 6, 6], "cross-dc-pd": [5, 7, 4], "same-dc-pd": [5, 8, 5]})
    c = claim_goodput(runs_of(tmp_path), None)
    assert c.verdict == DIFFERS and "over TTFT" in c.reason


def test_bcr_uses_the_measured_goodput(tmp_path):
    sweep(tmp_path, {"pdd": [5, 9, 6], "cross-dc-pd": [5, 7, 4], "same-dc-pd": [5, 7, 5]})
    c = claim_bcr(runs_of(tmp_path), None)
    assert c.figures["goodput_ratio"] == pytest.approx(9 / 7)
    lo = claim_bcr(runs_of(tmp_path), None)
    sweep(tmp_path / "x", {"pdd": [5, 6, 6], "cross-dc-pd": [5, 7, 4], "same-dc-pd": [5, 9, 5]})
    hi = claim_bcr(runs_of(tmp_path / "x"), None)
    assert hi.figures["bcr_change_pct"] < lo.figures["bcr_change_pct"]
    assert len(c.figures["cost_change_pct"]) == 2  # GPU-B at 1.2 and 1.3 x GPU-A


def _with_hosts(run_dir: Path, roles: dict[str, int]) -> None:
    """Give a written run's metadata a topology with ``roles[r]`` hosts of each role."""
    meta = json.loads((run_dir / "metadata.json").read_text())
    hosts = [{"name": f"{r}{i}", "roles": [r]} for r, n in roles.items() for i in range(n)]
    meta["topology"] = {"wan": WAN, "datacenters": [{"name": "a", "hosts": hosts}]}
    (run_dir / "metadata.json").write_text(json.dumps(meta))


def test_bcr_against_a_same_dc_baseline_of_its_own_size_costs_the_fleets_as_run(tmp_path):
    """paper-sweep with paper-samedc beside it: the baseline's goodput is the same-DC
    slot's, and each fleet is costed from its topology (4 chips an instance)."""
    d = sweep(tmp_path, {"pdd": [5, 9, 6], "cross-dc-pd": [5, 7, 4], "same-dc-pd": [9, 9, 9]})
    d.rename(tmp_path / "paper-sweep")
    _with_hosts(tmp_path / "paper-sweep", {"prefill": 9, "relay_decode": 2, "main_decode": 8})
    assert claim_bcr(runs_of(tmp_path), None).figures["fleets"] == "planned"  # no same-DC slot
    own = sweep(tmp_path / "o", {"same-dc-pd": [5, 6, 4]})
    own.rename(tmp_path / "paper-samedc")
    _with_hosts(tmp_path / "paper-samedc", {"prefill": 9, "relay_decode": 13, "main_decode": 1})
    c = claim_bcr(runs_of(tmp_path), None)
    f = c.figures
    assert (f["fleets"], f["base_slot"]) == ("as run", "paper-samedc")
    assert f["goodput_ratio"] == pytest.approx(9 / 6)  # not the sweep's same-dc-pd (9)
    assert f["fleet_pdd"] == [44, 32, 1] and f["fleet_base"] == 88  # the idle MD is not costed
    # cost at GPU-B 1.2 x GPU-A and a line at 0.333: (44 + 38.4 + 0.333) / 88
    cost = (44 + 32 * 1.2 + 0.333) / 88
    assert f["cost_change_pct"][0] == pytest.approx(100 * (cost - 1), abs=0.05)
    assert f["bcr_change_pct"] == pytest.approx(100 * (1.5 / cost - 1), abs=0.1)
    assert "costed as it ran" in c.reason


def test_p_rld_collapse(tmp_path):
    headline(tmp_path / "a", prld_e2e_extra=0.2)  # e2e 0.5+15x0.25 vs 0.5+15x0.05
    c = claim_p_rld(runs_of(tmp_path / "a"), None)
    assert c.figures["points"][0]["e2e_ratio"] == pytest.approx(4.25 / 1.25)
    assert c.verdict == REPRODUCED
    headline(tmp_path / "b")
    assert claim_p_rld(runs_of(tmp_path / "b"), None).verdict == DIFFERS


def test_p_rld_counts_the_requests_that_waited_for_rld_memory(tmp_path):
    d = headline(tmp_path)
    recs = [json.loads(x) for x in (d / "p-rld" / "requests.jsonl").read_text().splitlines()]
    for r, wait in zip(recs, (0.0, 1.5, 0.25)):
        r["reports"]["RLD"] = {"kv_wait_s": wait}
    (d / "p-rld" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    c = claim_p_rld(runs_of(tmp_path), None)
    row = c.figures["points"][0]
    assert (row["p_rld_kv_waited"], row["p_rld_kv_wait_max_s"]) == (2, 1.5)
    assert "2 waited for RLD's KV memory (at most 1.5 s)" in c.measured


def test_rld_peak_hold_counts_what_rld_decodes_at_once():
    def on_rld(i, first, n_tok, prompt):  # t_sent i; RLD's tokens from i+first, 1 s apart
        r = rec(i, first, n_tok=n_tok, rld=n_tok, tok_s=1.0, prompt=prompt)
        r["reports"]["router"] = decision(rld_budget_max_batch=8, rld_budget_kv_tokens=10_000)
        return r
    # r0 on RLD over [0, 4], r1 over [2, 4], r2 over [10, 11]; r3 is MD's only
    mode = ModeData("p-rld", (on_rld(0, 0.0, 5, 100), on_rld(1, 1.0, 3, 50),
                              on_rld(10, 0.0, 2, 10), rec(3, 0.1)))
    n, tokens, budget = rld_peak_hold(mode, token_scale=32)
    assert (n, budget) == (2, 10_000)
    assert tokens == 100 * 32 + 5 + 50 * 32 + 3  # both prompts and what RLD decoded of them


def bathtub_run(root: Path, pdd_by_hit: dict[float, float]) -> Path:
    p, b = [], []
    for j, (hit, t) in enumerate(pdd_by_hit.items()):
        for i in range(3):
            p.append(rec(10 * j + i, t, hit=hit))
            b.append(rec(10 * j + i, 1.0, hit=hit))
    return write_run(root, "headline", {"pdd": ("pdd", {}, p, 10.0),
                                        "cross-dc-pd": ("cross-dc-pd", {}, b, 10.0)})


def test_bathtub_shape(tmp_path):
    bathtub_run(tmp_path / "a", {0.5: 0.4, 0.925: 0.9, 0.995: 0.6})
    c = claim_bathtub(runs_of(tmp_path / "a"), None)
    assert [round(b) for _, b, _ in c.figures["points"]] == [60, 10, 40]
    assert c.verdict == REPRODUCED
    bathtub_run(tmp_path / "b", {0.5: 0.4, 0.925: 0.7, 0.995: 1.0})
    c = claim_bathtub(runs_of(tmp_path / "b"), None)
    assert c.verdict == DIFFERS and "no valley" in c.reason
    # an end only 5 points above the valley is within a bin's run-to-run spread
    bathtub_run(tmp_path / "c", {0.5: 0.4, 0.925: 0.9, 0.995: 0.85})
    c = claim_bathtub(runs_of(tmp_path / "c"), None)
    assert [round(b) for _, b, _ in c.figures["points"]] == [60, 10, 15]
    assert c.verdict == DIFFERS and "10 points" in c.reason


def test_bathtub_bins_with_too_few_requests_do_not_count(tmp_path):
    """The quick run's headline put 1 request in some bins: they are listed, not judged."""
    def run(root: Path, bins) -> Path:
        p, b = [], []
        for j, (hit, t, n) in enumerate(bins):
            p += [rec(10 * j + i, t, hit=hit) for i in range(n)]
            b += [rec(10 * j + i, 1.0, hit=hit) for i in range(n)]
        return write_run(root, "headline", {"pdd": ("pdd", {}, p, 10.0),
                                            "cross-dc-pd": ("cross-dc-pd", {}, b, 10.0)})

    run(tmp_path / "a", ((0.5, 0.4, 3), (0.925, 1.0, 1), (0.955, 0.9, 3), (0.995, 0.6, 3)))
    c = claim_bathtub(runs_of(tmp_path / "a"), None)
    assert "92.5%: +0% (n=1, not counted)" in c.measured
    assert c.verdict == REPRODUCED and "lowest inside +10% at 95.5%" in c.reason
    run(tmp_path / "b", ((0.5, 0.4, 3), (0.925, 1.0, 2), (0.995, 0.6, 3)))
    c = claim_bathtub(runs_of(tmp_path / "b"), None)
    assert c.verdict == NOT_HERE and "2 hit-rate bin(s) with >= 3 requests" in c.reason


def test_bathtub_slot_pairs_modes(tmp_path):
    modes = {}
    for tag, hit, t in (("b00", 0.5, 0.3), ("b95", 0.955, 0.95), ("b99", 0.995, 0.5)):
        modes[f"pdd-{tag}"] = ("pdd", {}, [rec(i, t, hit=hit) for i in range(3)], 10.0)
        modes[f"base-{tag}"] = ("cross-dc-pd", {}, [rec(i, 1.0, hit=hit) for i in range(3)],
                                10.0)
    write_run(tmp_path, "bathtub", modes)
    c = claim_bathtub(runs_of(tmp_path), None)
    assert [round(h, 1) for h, _, _ in c.figures["points"]] == [50.0, 95.5, 99.5]
    assert c.verdict == REPRODUCED


def test_filter(tmp_path):
    def recs(filter_on):
        out = [rec(i, 0.3, kv_wan=1000) for i in range(8)]
        for i in (8, 9):  # 2048 x 32 = 65536 modeled, 100 < 500 output tokens
            out.append(rec(i, 0.3, prompt=2048, max_out=100, kv_wan=0 if filter_on else 100000,
                           pipeline="rld-only" if filter_on else "p-md",
                           reason="anomalous: long input, short output" if filter_on else ""))
        return out

    write_run(tmp_path, "odd-traffic", {
        "filter-on": ("pdd", {"anomalous_filter": True}, recs(True), 10.0),
        "no-filters": ("pdd", {"anomalous_filter": False, "late_kv_local": False},
                       recs(False), 10.0)})
    c = claim_filter(runs_of(tmp_path), None)
    assert c.figures["caught_share"] == pytest.approx(0.2)
    assert c.figures["wan_bytes_change_pct"] == pytest.approx(100 * (8000 / 208000 - 1))
    assert c.verdict == REPRODUCED


def test_handoff_modes(tmp_path):
    one = [rec(i, 0.3, rld=5, stall=400.0, gap_at_handoff=0.45) for i in range(4)]
    cat = [rec(i, 0.3, rld=5, stall=40.0, gap_at_handoff=0.06) for i in range(4)]
    write_run(tmp_path, "handoff", {
        "one-shot": ("pdd", {"handoff_mode": "one-shot"}, one, 10.0),
        "catch-up": ("pdd", {"handoff_mode": "catch-up"}, cat, 10.0)})
    assert handoff_spikes(one) == pytest.approx([9.0] * 4)  # 0.45 s over a 0.05 s median
    c = claim_handoff_modes(runs_of(tmp_path), None)
    assert c.figures["one-shot"]["stall_p99_ms"] == pytest.approx(400.0)
    assert c.verdict == REPRODUCED


def full_dir(root: Path) -> Path:
    headline(root, prld_e2e_extra=0.2)
    (root / BENCH_FILE).write_text(json.dumps(bench()))
    return root


def test_table_from_runs_fills_every_claim(tmp_path):
    table = build_table(full_dir(tmp_path / "runs"))
    assert [c["key"] for c in table["claims"]] == [str(i) for i in range(1, 12)]
    # what the headline run alone gives: claims 10 and 11 need their own runs
    missing = {c["key"] for c in table["claims"] if c["measured"] == "-"}
    assert missing == {"10", "11"}
    assert all(c["reason"] for c in table["claims"])


def test_cli_from_runs_writes_the_table(tmp_path, capsys):
    src = full_dir(tmp_path / "runs")
    assert main(["reproduce", "--from-runs", str(src), "--out", str(tmp_path / "out")]) == 0
    doc = json.loads((tmp_path / "out" / "reproduction.json").read_text())
    assert doc["from_runs"] == str(src) and len(doc["claims"]) == 11
    md = (tmp_path / "out" / "reproduction.md").read_text()
    assert md.count("\n| ") == 12 and "**reproduced**" in md
    assert (tmp_path / "out" / "bathtub.png").stat().st_size > 0
    assert "TTFT vs cross-DC PD" in capsys.readouterr().out


def test_run_slots_records_a_failed_run_and_goes_on(tmp_path, capsys):
    ran = []

    def run_fn(scenario: Path, out: Path, scale=None) -> None:
        ran.append(out.name)
        if out.name == "odd-traffic":
            raise EmulationError("WAN did not come up")

    log = run_slots(QUICK, tmp_path, run_fn, lambda n: bench(), 10)
    assert ran == [s.name for s in QUICK]
    assert "WAN did not come up" in log["odd-traffic"]["error"]
    assert "slot odd-traffic failed (EmulationError: WAN did not come up)" in \
        capsys.readouterr().err
    assert log["headline"]["error"] is None
    assert json.loads((tmp_path / BENCH_FILE).read_text())["incremental_kv"]["n"] == 10


def test_an_interrupted_reproduction_keeps_the_table_of_what_finished(tmp_path):
    def run_fn(scenario: Path, out: Path, scale=None) -> None:
        if out.name != "headline":
            raise KeyboardInterrupt
        headline(out.parent, prld_e2e_extra=0.2)

    with pytest.raises(KeyboardInterrupt):
        reproduce(tmp_path, True, run_fn, None)
    doc = json.loads((tmp_path / "reproduction.json").read_text())
    assert doc["interrupted"] and doc["slots"] == ["headline"]
    assert doc["claims"][0]["verdict"] == REPRODUCED


def test_resume_keeps_finished_slots_and_runs_the_rest(tmp_path):
    """An interrupted reproduction, then --resume: the slot that finished (report written,
    no error) is kept, the interrupted one and the rest run, the bench runs once."""
    ran, benches = [], []

    def run_fn(scenario: Path, out: Path, scale=None) -> None:
        ran.append(out.name)
        if out.name == "odd-traffic" and len(ran) == 2:
            raise KeyboardInterrupt  # the first attempt stops here
        if out.name == "headline":
            shutil.rmtree(out, ignore_errors=True)  # a real run writes its folder afresh
            headline(out.parent, prld_e2e_extra=0.2)
        out.mkdir(exist_ok=True)
        (out / "summary.json").write_text("{}")  # what a finished run's report leaves

    def bench_fn(n):
        benches.append(n)
        return bench()

    with pytest.raises(KeyboardInterrupt):
        reproduce(tmp_path, True, run_fn, bench_fn)
    assert ran == ["headline", "odd-traffic"] and benches == []
    doc = reproduce(tmp_path, True, run_fn, bench_fn, resume=True)
    assert ran == ["headline", "odd-traffic", "odd-traffic", "handoff"] and benches == [10]
    assert doc["runs"]["headline"]["resumed"] and "resumed" not in doc["runs"]["handoff"]
    assert doc["slots_wall_s"] == pytest.approx(sum(e["wall_s"] for e in doc["runs"].values()))
    assert "1 slots kept from an earlier run" in (tmp_path / "reproduction.md").read_text()
    # a third run keeps everything, the bench included; without --resume all runs again
    reproduce(tmp_path, True, run_fn, bench_fn, resume=True)
    assert ran[4:] == [] and benches == [10]
    reproduce(tmp_path, True, run_fn, bench_fn)
    assert ran[4:] == [s.name for s in QUICK] and benches == [10, 10]
    # a table rebuilt from these runs (elsewhere, then twice in place) keeps their record
    for src, dst in ((tmp_path, tmp_path / "t1"), (tmp_path, tmp_path), (tmp_path, tmp_path)):
        doc = reproduce(dst, True, None, None, from_runs=src)
        assert doc["source"]["command"] == "testbed reproduce" and "runs" not in doc
        assert set(doc["source"]["runs"]) == {s.name for s in QUICK} | {"handoff-bench"}
        md = (dst / "reproduction.md").read_text()
        assert "The runs were made by `testbed reproduce`" in md and "| odd-traffic |" in md


def test_reproduce_needs_a_runner_or_runs(tmp_path):
    with pytest.raises(Exception, match="nothing to run"):
        reproduce(tmp_path, True, None, None)


@pytest.mark.parametrize("slot", FULL + QUICK, ids=lambda s: s.name + ":" + s.scenario)
def test_every_slot_scenario_is_valid(slot):
    sc = load_scenario(REPO / slot.scenario)
    assert sc.modes


def sweep_run(root: Path, k: float, base_p90: float, kv_wan: int) -> None:
    """scale-kK: pdd TTFT 0.5 s, the baseline's base_p90 s; kv_wan emulated bytes each."""
    def recs(ttft):
        return [rec(i, ttft, kv_wan=kv_wan) for i in range(10)]
    write_run(root, f"scale-k{k:g}", {
        "pdd": ("pdd", {}, recs(0.5), 10.0),
        "cross-dc-pd": ("cross-dc-pd", {}, recs(base_p90), 10.0),
        "pdd-ts64": ("pdd", {"token_scale": 64}, recs(0.5), 10.0),
        "base-ts64": ("cross-dc-pd", {"token_scale": 64}, recs(base_p90), 10.0)}, scale=k)


def test_scale_table_spreads_and_invariance(tmp_path):
    from testbed.report.scale_sweep import INVARIANT_PCT, render_scale, scale_table

    # the same nominal bytes at both k (emulated bytes x k), the same TTFT change
    sweep_run(tmp_path / "same", 25.0, 1.0, 4_000_000)
    sweep_run(tmp_path / "same", 50.0, 1.0, 2_000_000)
    rows, spread = scale_table(runs_of(tmp_path / "same"))
    assert [(r["k"], r["token_scale"]) for r in rows] == [(25, 32), (25, 64), (50, 32),
                                                          (50, 64)]
    assert rows[0]["ttft_p90_change_pct"] == pytest.approx(-50.0)
    assert rows[0]["base_wan_bytes"] == rows[2]["base_wan_bytes"] == 10 * 4_000_000 * 25
    assert spread["ttft_p90_change_pct"] == pytest.approx(0.0)
    assert spread["base_wan_bytes"] == pytest.approx(0.0) and spread["invariant"]
    # the baseline's tail shrinks at k=50 (-50% -> -20%) and the bytes differ by 2x
    sweep_run(tmp_path / "moves", 25.0, 1.0, 4_000_000)
    sweep_run(tmp_path / "moves", 50.0, 0.625, 4_000_000)
    rows, spread = scale_table(runs_of(tmp_path / "moves"))
    assert spread["ttft_p90_change_pct"] == pytest.approx(30.0)
    assert spread["base_wan_bytes"] == pytest.approx(100 * (2 - 1) / 1.5)
    assert spread["invariant"] is False and 30.0 > INVARIANT_PCT
    md = "\n".join(render_scale(rows, spread))
    assert md.count("\n| 25 |") + md.count("\n| 50 |") == 4 and "False" in md


def test_the_sweep_runs_each_slot_at_its_k(tmp_path):
    from testbed.report.reproduce import SWEEP

    seen = []

    def run_fn(scenario: Path, out: Path, scale=None) -> None:
        seen.append((out.name, scale, scenario.name))

    run_slots(SWEEP, tmp_path, run_fn, None, 0)
    assert seen == [(f"scale-k{k}", float(k), "scale-sweep.yaml") for k in (10, 25, 50, 100)]
    assert load_scenario(REPO / SWEEP[0].scenario).name == "scale-sweep"


def test_two_commands_never_write_one_folder(tmp_path, capsys):
    """A second reproduce (run, suite, serve: the same lock) into a folder another holds
    is refused with the folder and the holder named; once released it runs."""
    from testbed.cli import LOCK_FILE, out_dir_lock

    src, out = full_dir(tmp_path / "runs"), tmp_path / "out"
    argv = ["reproduce", "--from-runs", str(src), "--out", str(out)]
    with out_dir_lock(out, "testbed reproduce --out out"):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{out}: another command is writing this folder" in err
        assert "testbed reproduce --out out" in err and not (out / "reproduction.md").exists()
    assert main(argv) == 0 and (out / "reproduction.md").is_file()
    assert (out / LOCK_FILE).read_text().startswith("pid ")


def test_sigterm_ends_a_reproduction_with_143_and_its_partial_table(tmp_path, monkeypatch, capsys):
    """SIGTERM reaches the runner as net.apply.Terminated: the table of what finished is
    written (interrupted), and the command says so and exits 143, not with a traceback."""
    from testbed.net.apply import Terminated
    from testbed.report import reproduce as rep

    def stop(*a, **k):
        raise Terminated("signal 15")

    monkeypatch.setattr(rep, "run_slots", stop)
    monkeypatch.setattr("testbed.scenario.runner.run_scenario", stop)
    assert main(["reproduce", "--quick", "--out", str(tmp_path)]) == 143
    assert "terminated (signal 15)" in capsys.readouterr().err
    assert json.loads((tmp_path / "reproduction.json").read_text())["interrupted"] is True


def test_bathtub_slot_bins_each_request_by_its_own_hit_rate(tmp_path):
    """A mode aimed at one bin also holds its sessions' cold first turns (designed hit 0):
    they count in the 0-90% bin, not in the mode's (binned per mode, the full run of
    2026-12-02 read 24% and 74-81% for the 7 bins)."""
    modes = {}
    for j, (tag, hit, t) in enumerate((("b95", 0.955, 0.95), ("b99", 0.995, 0.6))):
        ids = range(10 * j, 10 * j + 6)
        hits = [0.0] * 3 + [hit] * 3
        modes[f"pdd-{tag}"] = ("pdd", {}, [rec(i, 0.4 if h == 0 else t, hit=h)
                                           for i, h in zip(ids, hits)], 10.0)
        modes[f"base-{tag}"] = ("cross-dc-pd", {}, [rec(i, 1.0, hit=h)
                                                    for i, h in zip(ids, hits)], 10.0)
    write_run(tmp_path, "bathtub", modes)
    c = claim_bathtub(runs_of(tmp_path), None)
    assert [(round(h, 1), round(b), n) for h, b, n in c.figures["points"]] == [
        (0.0, 60, 6), (95.5, 5, 3), (99.5, 40, 3)]
    assert c.verdict == REPRODUCED and "slot's mode pairs pooled" in str(c.conditions)
