"""The metric catalogue: every figure a mode's summary.json carries, named once.

Owns ``METRICS`` (one ``Metric`` per name: its unit, a line of meaning, and
whether a scenario's expectation may bound it) and the name lists derived from
it, which the scenario reader (testbed/spec/scenario.py: what ``metric:`` may
name), the report (testbed/report/metrics.py: the per-mode keys and what an
expectation or a comparison may read) and the docs' check
(tests/unit/test_catalog.py: docs/run-directory.md names every one) all take
from here. Adding a metric is one entry here and the function that computes it
in testbed/report/metrics.py (``mode_metrics``), which must return exactly these
keys. Imports nothing of the testbed: the bottom layer.

Example::

    from testbed.catalog import BOUNDABLE, by_name
    "ttft_p90_s" in BOUNDABLE                  # True
    by_name("wan_kv_share").unit               # "share"
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str        # s, ms, bytes, share (0-1), ratio, count, req/s, ...
    doc: str         # one line: what it measures (docs/run-directory.md says more)
    boundable: bool = True   # an expectation may bound it (``metric:``)
    paired: bool = False     # a (mode, baseline) figure over the same requests: only a
    #                          comparison bounds it


# summary.json's per-mode figures, in contract order (docs/run-directory.md)
METRICS: tuple[Metric, ...] = (
    Metric("requests_total", "count", "requests the workload sent in the mode"),
    Metric("requests_completed", "count", "requests that ended with every token"),
    Metric("requests_failed", "count", "requests that ended with an error, each with a reason"),
    Metric("tokens_lost", "tokens", "output positions the client never received"),
    Metric("tokens_duplicated", "tokens", "output positions the client received twice"),
    Metric("ttft_p50_s", "s", "time to first token, median over completed requests"),
    Metric("ttft_p90_s", "s", "time to first token, 90th percentile"),
    Metric("ttft_p99_s", "s", "time to first token, 99th percentile"),
    Metric("ttft_mean_s", "s", "time to first token, mean"),
    Metric("ttft_high_hit_p50_s", "s", "TTFT median of the requests designed with a prefix "
           "hit rate >= 0.9 (null for a trace)"),
    Metric("tpot_p50_ms", "ms", "time per output token after the first, median over requests"),
    Metric("e2e_p99_s", "s", "end-to-end latency, 99th percentile"),
    Metric("goodput_rps", "req/s", "requests completed within the SLA per second of workload"),
    Metric("handoff_stall_p99_ms", "ms", "the stall in a relayed request's token stream at "
           "its handoff, 99th percentile"),
    Metric("relay_overhead_p50_ms", "ms", "P's prefill end to RLD's first token, median over "
           "relayed requests"),
    Metric("relay_overhead_p90_ms", "ms", "the same, 90th percentile"),
    Metric("after_prefill_p50_s", "s", "the first token's arrival minus P's prefill end, median"),
    Metric("after_prefill_p90_s", "s", "the same, 90th percentile"),
    Metric("wan_bytes", "bytes", "bytes on the WAN, nominal (emulated x k)"),
    Metric("intra_dc_bytes", "bytes", "bytes on intra-datacenter links, nominal"),
    Metric("rld_token_share", "share", "output tokens RLD produced over all output tokens"),
    Metric("relayed_share", "share", "completed requests whose pipeline involved RLD"),
    Metric("kv_prediction_error_p50", "ratio", "the router's WAN model: |predicted - actual| / "
           "actual KV time to MD, median"),
    Metric("kv_prediction_error_p90", "ratio", "the same, 90th percentile"),
    Metric("wan_rate_max_over_shaper", "ratio", "the largest WAN rate links.csv shows over the "
           "rate its shaper allowed then"),
    Metric("p_hit_rate_mean", "share", "mean prefix hit rate at P's cache"),
    Metric("md_hit_rate_mean", "share", "mean prefix hit rate at MD's decode-side cache"),
    Metric("drc_hit_gap", "share", "P's mean hit rate minus MD's over the same requests"),
    Metric("wan_kv_share", "share", "the mode's KV and handoff bytes on the WAN over what the "
           "a>b shaper allowed in the workload window"),
    Metric("decision_regret_share", "share", "routing decisions the run's measured times would "
           "have reversed"),
    Metric("rss_slope_max_mb_per_min", "MB/min", "the serving roles' largest resident-memory "
           "slope over the window's second half"),
    Metric("fd_slope_max_per_min", "fds/min", "the serving roles' largest open-descriptor slope"),
    Metric("md_imbalance", "ratio", "the busiest MD's requests over the MDs' mean"),
    Metric("p_imbalance", "ratio", "the busiest P's requests over the P's mean"),
    Metric("emulated.wan_bytes", "bytes", "bytes on the WAN as emulated (nominal / k)"),
    Metric("emulated.intra_dc_bytes", "bytes", "intra-datacenter bytes as emulated"),
    Metric("paired_ttft_ratio_p50", "ratio", "median over the requests the mode did not relay "
           "of its TTFT over the baseline's for the same request", paired=True),
)

_BY_NAME = {m.name: m for m in METRICS}
if len(_BY_NAME) != len(METRICS):
    raise ImportError("testbed/catalog.py: a metric is named twice")

# the per-mode figures (summary.json's modes.MODE keys that are numbers, besides the
# nested "emulated", "hindsight" and "balance" objects)
MODE_FIGURES = tuple(m.name for m in METRICS if not m.paired and "." not in m.name)
# what an expectation may name as ``metric:`` of one mode (or compare between two)
BOUNDABLE = tuple(m.name for m in METRICS if m.boundable and not m.paired)
# what only a comparison (``baseline:``) may name
PAIRED = tuple(m.name for m in METRICS if m.paired)


def by_name(name: str) -> Metric:
    """The catalogue's entry (KeyError naming the known metrics for an unknown name)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a metric (known: {', '.join(_BY_NAME)})") from None
