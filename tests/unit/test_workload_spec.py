"""Workload spec validation: every error names file, YAML path, expected and got."""

from __future__ import annotations

import copy

import pytest

from testbed.errors import SpecError
from testbed.reader import Fields, load_yaml
from testbed.workload import WorkloadKind, parse_workload
from testbed.workload.arrivals import ArrivalProcess
from testbed.workload.hitrate import PDD_BINS_PCT, skewed_bins
from testbed.workload.lengths import LengthKind

SYNTH = {
    "kind": "synthetic",
    "seed": 3,
    "n_requests": 100,
    "arrival": {"process": "poisson", "rate_rps": 4},
    "input_len": {"dist": "uniform", "min_tokens": 256, "max_tokens": 1024},
    "output_len": {"dist": "fixed", "tokens": 32},
    "hit_rate": {"mean_pct": 90},
}
TIMED = {k: v for k, v in SYNTH.items() if k != "n_requests"} | {"duration_s": 60}
MOON = {"kind": "mooncake", "path": "traces/t.jsonl"}
DELETE = object()


def changed(base: dict, path: str, value) -> dict:
    data = copy.deepcopy(base)
    keys = path.split(".")
    node = data
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    last = int(keys[-1]) if keys[-1].isdigit() else keys[-1]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


def parse(data: dict, where: str = "workload"):
    return parse_workload(Fields(data, "s.yaml", where))


@pytest.mark.parametrize("base,path,value,where,expected", [
    (SYNTH, "kind", "trace", "workload.kind", "one of synthetic, mooncake"),
    (SYNTH, "duration_s", 10, "workload.n_requests", "exactly one of n_requests and duration_s"),
    (SYNTH, "n_requests", DELETE, "workload.n_requests", "exactly one of"),
    (SYNTH, "n_requests", 0, "workload.n_requests", "an integer >= 1"),
    (SYNTH, "n_requests", 2.5, "workload.n_requests", "an integer"),
    (SYNTH, "seed", -1, "workload.seed", "an integer >= 0"),
    (SYNTH, "rate_rps", 3, "workload.rate_rps", "a known field"),
    (SYNTH, "arrival.process", "uniform", "workload.arrival.process", "one of poisson, bursty"),
    (SYNTH, "arrival.rate_rps", 0, "workload.arrival.rate_rps", "> 0"),
    (SYNTH, "arrival.rate_rps", "4/s", "workload.arrival.rate_rps", "units are in the field"),
    (SYNTH, "arrival", {"process": "bursty", "rate_rps": 5, "burst_size": 8},
     "workload.arrival.burst_gap_s", "this field to be set"),
    (SYNTH, "arrival", {"process": "bursty", "rate_rps": 5, "burst_size": 0, "burst_gap_s": 1},
     "workload.arrival.burst_size", "an integer >= 1"),
    (SYNTH, "arrival", {"process": "fixed", "interval_s": 0.5, "rate_rps": 2},
     "workload.arrival.rate_rps", "a known field"),
    (SYNTH, "arrival", {"process": "fixed", "interval_s": 0},
     "workload.arrival.interval_s", "a number of s > 0"),
    (SYNTH, "input_len.dist", "normal", "workload.input_len.dist", "one of fixed, uniform"),
    (SYNTH, "input_len.max_tokens", 100, "workload.input_len.max_tokens", ">= min_tokens (256)"),
    (SYNTH, "input_len", {"dist": "fixed", "tokens": 0}, "workload.input_len.tokens",
     "an integer >= 1"),
    (SYNTH, "input_len", {"dist": "lognormal", "median_tokens": 512, "sigma": 1},
     "workload.input_len.max_tokens", "this field to be set"),
    (SYNTH, "input_len", {"dist": "lognormal", "median_tokens": 5000, "sigma": 1,
                          "max_tokens": 4096}, "workload.input_len.median_tokens", "within"),
    (SYNTH, "input_len", {"dist": "choice", "tokens": [128, 256], "weights": [1]},
     "workload.input_len.weights", "a list of 2 weights"),
    (SYNTH, "input_len", {"dist": "choice", "tokens": [128, -1]},
     "workload.input_len.tokens[1]", "a token count"),
    (SYNTH, "output_len", DELETE, "workload.output_len", "this field to be set"),
    (SYNTH, "output_len.tokens_out", 3, "workload.output_len.tokens_out", "a known field"),
    (SYNTH, "hit_rate", {"mean_pct": 90, "pdd_bins": [1] * 7}, "workload.hit_rate",
     "exactly one of pdd_bins, bins, mean_pct"),
    (SYNTH, "hit_rate", {}, "workload.hit_rate", "exactly one of"),
    (SYNTH, "hit_rate", {"pdd_bins": [1] * 6}, "workload.hit_rate.pdd_bins",
     "7 weights, one per PDD bin 0-90% 90-95%"),
    (SYNTH, "hit_rate", {"pdd_bins": [1, 1, -1, 1, 1, 1, 1]}, "workload.hit_rate.pdd_bins[2]",
     "a weight >= 0"),
    (SYNTH, "hit_rate", {"pdd_bins": [0] * 7}, "workload.hit_rate.pdd_bins",
     "weights with a positive sum"),
    (SYNTH, "hit_rate", {"mean_pct": 30}, "workload.hit_rate.mean_pct", "a number of % >= 45"),
    (SYNTH, "hit_rate", {"mean_pct": 99.9}, "workload.hit_rate.mean_pct", "<= 99.5"),
    (SYNTH, "hit_rate", {"bins": [{"lo_pct": 0, "hi_pct": 50, "weight": 1},
                                  {"lo_pct": 40, "hi_pct": 60, "weight": 1}]},
     "workload.hit_rate.bins[1].lo_pct", "not overlapping the previous one (0-50%)"),
    (SYNTH, "hit_rate", {"bins": [{"lo_pct": 50, "hi_pct": 50, "weight": 1}]},
     "workload.hit_rate.bins[0].hi_pct", "equal only at 0 or 100"),
    (SYNTH, "hit_rate", {"bins": [{"lo_pct": 90, "hi_pct": 120, "weight": 1}]},
     "workload.hit_rate.bins[0].hi_pct", "<= 100"),
    (SYNTH, "hit_rate", {"bins": [{"lo_pct": 90, "hi_pct": 100}]},
     "workload.hit_rate.bins[0].weight", "this field to be set"),
    (SYNTH, "hit_rate", {"bins": [{"lo_pct": 90, "hi_pct": 100, "weight": 1, "w": 2}]},
     "workload.hit_rate.bins[0].w", "a known field"),
    (SYNTH, "hit_rate", {"bins": []}, "workload.hit_rate.bins", "at least 1 item"),
    (SYNTH, "sessions", {"concurrent": 4, "turns": 0}, "workload.sessions.turns", ">= 1"),
    (SYNTH, "sessions", {"count": 4}, "workload.sessions.count", "a known field"),
    (SYNTH, "anomalous", {"share_pct": 150, "input_len": {"dist": "fixed", "tokens": 9000}},
     "workload.anomalous.share_pct", "<= 100"),
    (SYNTH, "anomalous", {"share_pct": 3}, "workload.anomalous.input_len", "this field to be set"),
    (SYNTH, "anomalous", {"share_pct": 3, "input_len": {"dist": "fixed", "tokens": 9000},
                          "output_len": {"dist": "fixed", "tokens": 600}},
     "workload.anomalous.output_len", "below 500 output tokens"),
    (TIMED, "arrival.rate_rps", 1e5, "workload.duration_s", "giving at most 1000000 requests"),
    (TIMED, "duration_s", 1e6, "workload.duration_s", "<= 604800"),
    (TIMED, "duration_s", 0, "workload.duration_s", "a number of s > 0"),
    (MOON, "path", DELETE, "workload.path", "this field to be set"),
    (MOON, "path", "", "workload.path", "a non-empty string"),
    (MOON, "input_len_divisor", 3, "workload.input_len_divisor", "a divisor of block_tokens"),
    (MOON, "input_len_divisor", 0, "workload.input_len_divisor", "an integer >= 1"),
    (MOON, "sample_every", 2, None, None),  # valid alone
    (MOON, "sample_pct", 0, "workload.sample_pct", "> 0"),
    (MOON, "time_scale", 0, "workload.time_scale", "> 0"),
    (MOON, "start_s", -1, "workload.start_s", ">= 0"),
    (MOON, "missing_ok", "no", "workload.missing_ok", "true or false"),
    (MOON, "max_requests", 0, "workload.max_requests", "an integer >= 1"),
    (MOON, "hash_block", 512, "workload.hash_block", "a known field"),
])
def test_validation_table(base, path, value, where, expected):
    data = changed(base, path, value)
    if expected is None:
        parse(data)
        return
    with pytest.raises(SpecError) as info:
        parse(data)
    e = info.value
    assert e.file == "s.yaml"
    assert e.path.startswith(where), e
    assert expected in e.expected, e
    assert str(e).startswith("s.yaml: workload"), e


def test_sample_every_and_pct_exclusive():
    with pytest.raises(SpecError, match="only one of sample_every and sample_pct"):
        parse(dict(MOON, sample_every=2, sample_pct=50))


def test_yaml_errors_carry_line_numbers(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("kind: synthetic\nn_requests: 5\narival: {process: poisson, rate_rps: 1}\n")
    with pytest.raises(SpecError) as info:
        parse_workload(Fields(load_yaml(path), str(path), ""))
    assert info.value.path in ("arrival", "arival (line 3)")


def test_synthetic_parse_and_defaults():
    spec = parse(SYNTH)
    assert spec.kind is WorkloadKind.SYNTHETIC and spec.mooncake is None
    s = spec.synthetic
    assert s.seed == 3 and s.n_requests == 100 and s.duration_s is None
    assert s.arrival.process is ArrivalProcess.POISSON and s.arrival.mean_rate_rps == 4
    assert s.input_len.kind is LengthKind.UNIFORM and s.input_len.max_tokens == 1024
    assert s.hit_rate.form == "mean_pct" and s.hit_rate.bins == skewed_bins(90)
    assert (s.sessions.concurrent, s.sessions.turns, s.sessions.shared_prefixes) == (16, 8, 4)
    assert s.anomalous is None


def test_bursty_mean_rate_and_choice_weights():
    data = dict(SYNTH, arrival={"process": "bursty", "rate_rps": 10, "burst_size": 5,
                                "burst_gap_s": 1.5},
                input_len={"dist": "choice", "tokens": [100, 300], "weights": [3, 1]})
    s = parse(data).synthetic
    assert s.arrival.mean_rate_rps == pytest.approx(5 / (0.5 + 1.5))
    assert s.input_len.weights == (0.75, 0.25) and s.input_len.max_tokens == 300


def test_pdd_bins_and_custom_bins_are_normalised():
    s = parse(dict(SYNTH, hit_rate={"pdd_bins": [2, 1, 1, 1, 1, 1, 1]})).synthetic
    assert [(b.lo_pct, b.hi_pct) for b in s.hit_rate.bins] == list(PDD_BINS_PCT)
    assert s.hit_rate.bins[0].weight == pytest.approx(0.25)
    bins = [{"lo_pct": 0, "hi_pct": 0, "weight": 1}, {"lo_pct": 0, "hi_pct": 50, "weight": 1},
            {"lo_pct": 95, "hi_pct": 100, "weight": 1}, {"lo_pct": 100, "hi_pct": 100, "weight": 1}]
    s = parse(dict(SYNTH, hit_rate={"bins": bins})).synthetic
    assert [b.weight for b in s.hit_rate.bins] == [0.25] * 4


def test_mooncake_parse_and_defaults():
    m = parse(dict(MOON, input_len_divisor=32, sample_pct=50, seed=4)).mooncake
    assert (m.block_tokens, m.scaled_block_tokens, m.output_len_divisor) == (512, 16, 1)
    assert (m.time_scale, m.start_s, m.duration_s, m.max_requests) == (1.0, 0.0, None, None)
    assert m.missing_ok is False and m.sample_pct == 50 and m.seed == 4


@pytest.mark.parametrize("mean", [45, 60, 80, 90, 95, 97, 98.5, 99.5])
def test_skewed_bins_reach_the_requested_mean(mean):
    bins = skewed_bins(mean)
    assert sum(b.weight for b in bins) == pytest.approx(1)
    assert all(b.weight >= 0 for b in bins)
    assert sum(b.weight * b.mid_pct for b in bins) == pytest.approx(mean)


def test_skewed_bins_at_90_match_the_paper():
    above_95 = sum(b.weight for b in skewed_bins(90) if b.lo_pct >= 95)
    assert 0.70 <= above_95 <= 0.80  # the paper: 70-80% of requests hit > 95%
