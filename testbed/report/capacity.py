"""Capacity planning and benefit-cost ratio (the paper's claim 7, docs/paper.md), as pure arithmetic.

Owns PlanWorkload, Capacities, Fleet, Prices, ``capacities_from_cost_model``,
``size_fleets``, ``fleet_cost``, ``compare_fleets``, ``implied_wan_price``,
``load_capacity_config`` and ``format_plan``. No I/O except reading the
optional YAML file; the per-chip capacities come from testbed.pdd.compute.costmodel
(read-only import), or the caller passes its own.

The calculation, for a demand of ``demand_rps`` requests of one shape
(``context_tokens`` prompt, ``hit_rate`` prefix hit, ``output_tokens``):

- capacity per chip, in requests/s: prefill on GPU-A (one instance's
  ``1 / prefill_s(miss, cached)`` / n_chips), decode on GPU-A and on GPU-B
  (a batch of ``min(KV memory, largest batch whose step fits the TPOT
  SLO)`` requests, each needing ``output_tokens`` steps);
- same-DC homogeneous PD (the paper's 88 GPU-A): ``ceil(d / prefill_a) +
  ceil(d / decode_a)`` GPU-A chips;
- PDD: P on GPU-A as above, RLD on GPU-A for RLD's share of the output
  tokens ``s`` (``ceil(d s / decode_a)``), MD on GPU-B for the rest
  (``ceil(d (1 - s) / decode_b)``), and ``ceil(offered WAN Gbit/s / line
  rate)`` WAN lines for the KV that misses the decode side's cache;
- cost = sum of chips x price + WAN lines x line price; BCR = goodput within
  SLA / cost, so BCR change = goodput ratio / cost ratio - 1.

The paper's figures (docs/paper.md; tests/unit/test_capacity.py checks them): 43 GPU-A +
32 GPU-B + one WAN line vs 88 GPU-A, cost -3.5% to -7.1% with GPU-B priced
20-30% above GPU-A. The paper gives no WAN line price: the two ends imply
0.32 and 0.35 GPU-A (``implied_wan_price``), so the default is 1/3 of a
GPU-A. With goodput +27.8% the cost ratio 0.929 gives BCR +37.6% (the
paper: "up to +37.5%").

Example::

    caps = capacities_from_cost_model(PlanWorkload())
    pdd, base = size_fleets(PlanWorkload(demand_rps=10), caps, rld_token_share=0.062)
    compare_fleets(pdd, base, Prices(gpu_b=1.2), goodput_ratio=1.278)["bcr_change_pct"]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from testbed.pdd.compute.costmodel import BIG_MODEL, GPU_A, GPU_B, ChipProfile, CostModel, ModelProfile

WAN_LINE_PRICE_DEFAULT = 1.0 / 3.0  # GPU-A prices; implied by the paper's figures (implied_wan_price)


@dataclass(frozen=True)
class PlanWorkload:
    """One request shape, the demand and the SLO the fleet is sized for."""

    context_tokens: int = field(default=65536, metadata={"help": "modeled prompt tokens"})
    hit_rate: float = field(default=0.9, metadata={"help": "prefix hit rate, 0..1"})
    output_tokens: int = field(default=1024, metadata={"help": "output tokens per request"})
    tpot_ms: float = field(default=50.0, metadata={"help": "TPOT SLO: a decode step's budget"})
    demand_rps: float = field(default=10.0, metadata={"help": "requests/s the fleet must serve"})
    kv_bytes_per_token: int = field(default=BIG_MODEL.kv_bytes_per_token,
                                    metadata={"help": "modeled KV bytes per token"})

    def __post_init__(self) -> None:
        if not 0.0 <= self.hit_rate <= 1.0:
            raise ValueError(f"hit_rate must be in [0, 1], got {self.hit_rate}")
        for name in ("context_tokens", "output_tokens", "tpot_ms", "demand_rps",
                     "kv_bytes_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def miss_tokens(self) -> int:
        return max(1, round(self.context_tokens * (1.0 - self.hit_rate)))

    def wan_gbit(self) -> float:
        """Offered WAN rate: the missed KV of every request, Gbit/s."""
        return self.demand_rps * self.miss_tokens * self.kv_bytes_per_token * 8 / 1e9


@dataclass(frozen=True)
class Capacities:
    """Requests/s one chip sustains in each job."""

    prefill_a: float
    decode_a: float
    decode_b: float

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if not v > 0:
                raise ValueError(f"capacity {k} must be > 0, got {v}")


@dataclass(frozen=True)
class Fleet:
    gpu_a: int
    gpu_b: int = 0
    wan_lines: int = 0
    detail: dict = field(default_factory=dict, compare=False)  # chips per role


@dataclass(frozen=True)
class Prices:
    """Prices in any one currency unit (the defaults: GPU-A = 1)."""

    gpu_a: float = 1.0
    gpu_b: float = 1.2
    wan_line: float = WAN_LINE_PRICE_DEFAULT


def decode_rps_per_chip(cost: CostModel, wl: PlanWorkload) -> float:
    """One decode instance's requests/s under the TPOT SLO, per chip."""
    mean_ctx = wl.context_tokens + wl.output_tokens // 2
    by_memory = cost.kv_capacity_tokens() // (wl.context_tokens + wl.output_tokens)
    by_step = cost.max_batch(mean_ctx, wl.tpot_ms / 1e3)
    batch = min(by_memory, by_step)
    if batch < 1:
        raise ValueError(f"{cost.chip.name}: not one request of {wl.context_tokens} tokens fits "
                         f"(KV memory for {by_memory}, TPOT budget for {by_step})")
    step_s = cost.decode_step_s(batch, batch * mean_ctx)
    return batch / (wl.output_tokens * step_s) / cost.n_chips


def capacities_from_cost_model(wl: PlanWorkload, chip_a: ChipProfile = GPU_A,
                               chip_b: ChipProfile = GPU_B, n_chips: int = 4,
                               model: ModelProfile | None = None) -> Capacities:
    """Per-chip capacities from the testbed's roofline (testbed.pdd.compute.costmodel)."""
    model = model or replace(BIG_MODEL, kv_bytes_per_token=wl.kv_bytes_per_token)
    a, b = CostModel(chip_a, model, n_chips), CostModel(chip_b, model, n_chips)
    prefill_s = a.prefill_s(wl.miss_tokens, wl.context_tokens - wl.miss_tokens)
    return Capacities(prefill_a=1.0 / prefill_s / n_chips,
                      decode_a=decode_rps_per_chip(a, wl), decode_b=decode_rps_per_chip(b, wl))


def _chips(load_rps: float, per_chip_rps: float) -> int:
    return math.ceil(load_rps / per_chip_rps - 1e-9) if load_rps > 0 else 0


def size_fleets(wl: PlanWorkload, caps: Capacities, rld_token_share: float,
                wan_line_gbit: float = 100.0) -> tuple[Fleet, Fleet]:
    """(PDD fleet, same-DC homogeneous GPU-A fleet) serving ``wl.demand_rps``."""
    if not 0.0 <= rld_token_share <= 1.0:
        raise ValueError(f"rld_token_share must be in [0, 1], got {rld_token_share}")
    if wan_line_gbit <= 0:
        raise ValueError(f"wan_line_gbit must be > 0, got {wan_line_gbit}")
    d = wl.demand_rps
    p = _chips(d, caps.prefill_a)
    rld = _chips(d * rld_token_share, caps.decode_a)
    md = _chips(d * (1.0 - rld_token_share), caps.decode_b)
    dec = _chips(d, caps.decode_a)
    lines = max(1, math.ceil(wl.wan_gbit() / wan_line_gbit - 1e-9))
    pdd = Fleet(p + rld, md, lines, {"P": p, "RLD": rld, "MD": md,
                                     "wan_gbit": wl.wan_gbit()})
    base = Fleet(p + dec, 0, 0, {"P": p, "D": dec})
    return pdd, base


def fleet_cost(fleet: Fleet, prices: Prices) -> float:
    return fleet.gpu_a * prices.gpu_a + fleet.gpu_b * prices.gpu_b + \
        fleet.wan_lines * prices.wan_line


def compare_fleets(pdd: Fleet, base: Fleet, prices: Prices,
                   goodput_ratio: float | None = None) -> dict:
    """Cost change of PDD's fleet vs the baseline's, and the BCR change when the
    goodput ratio (PDD / baseline, within SLA) is known. Percentages."""
    c_pdd, c_base = fleet_cost(pdd, prices), fleet_cost(base, prices)
    cost_ratio = c_pdd / c_base
    bcr = None if goodput_ratio is None else 100.0 * (goodput_ratio / cost_ratio - 1.0)
    return {"cost_pdd": c_pdd, "cost_base": c_base,
            "cost_change_pct": 100.0 * (cost_ratio - 1.0), "bcr_change_pct": bcr}


def implied_wan_price(pdd: Fleet, base: Fleet, prices: Prices, cost_change_pct: float) -> float:
    """The WAN line price that makes PDD's fleet cost ``cost_change_pct`` vs the base."""
    if pdd.wan_lines == 0:
        raise ValueError("the PDD fleet has no WAN line")
    target = fleet_cost(base, prices) * (1.0 + cost_change_pct / 100.0)
    chips = pdd.gpu_a * prices.gpu_a + pdd.gpu_b * prices.gpu_b
    return (target - chips) / pdd.wan_lines


@dataclass(frozen=True)
class CapacityConfig:
    """What `testbed capacity --config FILE` reads; every field has a default."""

    workload: PlanWorkload = PlanWorkload()
    chip_a: ChipProfile = GPU_A
    chip_b: ChipProfile = GPU_B
    n_chips: int = 4
    gpu_b_prices: tuple[float, ...] = (1.2, 1.3)  # GPU-A = gpu_a_price
    gpu_a_price: float = 1.0
    wan_line_price: float = WAN_LINE_PRICE_DEFAULT
    wan_line_gbit: float = 100.0
    rld_token_share: float = 0.062
    goodput_ratio: float | None = 1.278  # PDD / same-DC PD within SLA (the paper's +27.8%, docs/paper.md)


def _chip(f, key: str, base: ChipProfile) -> ChipProfile:
    sub = f.sub(key, None)
    if sub is None:
        return base
    kw = {k: sub.num(k, getattr(base, k), lo=0, lo_open=True)
          for k in ("peak_tflops", "mem_bw_tbs", "compute_eff", "mem_eff", "hbm_gb")}
    kw["pass_overhead_ms"] = sub.num("pass_overhead_ms", base.pass_overhead_ms, lo=0)
    name = sub.str("name", base.name)
    sub.done()
    return ChipProfile(name, **kw)


def parse_capacity_config(data: object, file: str) -> CapacityConfig:
    """The YAML's plain data -> CapacityConfig; unknown keys and bad values are SpecErrors.

    Example file::

        workload: {context_tokens: 65536, hit_rate: 0.9, output_tokens: 1024, tpot_ms: 50,
                   demand_rps: 10}
        chips: {a: {peak_tflops: 990, mem_bw_tbs: 3.35}, b: {mem_bw_tbs: 4.8, hbm_gb: 141}}
        prices: {gpu_a: 1.0, gpu_b: [1.2, 1.3], wan_line: 0.333}
        wan_line_gbit: 100
        rld_token_share: 0.062
        goodput_ratio: 1.278
    """
    from testbed.reader import Fields

    d = CapacityConfig()
    f = Fields(data if data is not None else {}, file, "")
    w = f.sub("workload", None)
    wl = d.workload
    if w is not None:
        wl = PlanWorkload(
            context_tokens=w.int("context_tokens", wl.context_tokens, lo=1),
            hit_rate=w.num("hit_rate", wl.hit_rate, lo=0, hi=1),
            output_tokens=w.int("output_tokens", wl.output_tokens, lo=1),
            tpot_ms=w.num("tpot_ms", wl.tpot_ms, lo=0, lo_open=True),
            demand_rps=w.num("demand_rps", wl.demand_rps, lo=0, lo_open=True),
            kv_bytes_per_token=w.int("kv_bytes_per_token", wl.kv_bytes_per_token, lo=1))
        w.done()
    chips = f.sub("chips", None)
    chip_a, chip_b = d.chip_a, d.chip_b
    if chips is not None:
        chip_a, chip_b = _chip(chips, "a", d.chip_a), _chip(chips, "b", d.chip_b)
        chips.done()
    p = f.sub("prices", None)
    price_a, prices_b, wan_price = d.gpu_a_price, d.gpu_b_prices, d.wan_line_price
    if p is not None:
        price_a = p.num("gpu_a", price_a, lo=0, lo_open=True)
        raw_b = p.raw("gpu_b", list(prices_b))
        raw_b = raw_b if isinstance(raw_b, list) else [raw_b]
        if not raw_b or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                and x > 0 for x in raw_b):
            raise p.error("gpu_b", "a positive number or a list of them", raw_b)
        prices_b = tuple(float(x) for x in raw_b)
        wan_price = p.num("wan_line", wan_price, lo=0)
        p.done()
    goodput = f.raw("goodput_ratio", d.goodput_ratio)
    if f.has("goodput_ratio") and goodput is not None:  # null: cost only, no BCR
        goodput = f.num("goodput_ratio", lo=0, lo_open=True)
    cfg = CapacityConfig(wl, chip_a, chip_b, f.int("n_chips", d.n_chips, lo=1), prices_b,
                         price_a, wan_price,
                         f.num("wan_line_gbit", d.wan_line_gbit, lo=0, lo_open=True),
                         f.num("rld_token_share", d.rld_token_share, lo=0, hi=1), goodput)
    f.done()
    return cfg


def load_capacity_config(path: str | Path | None) -> CapacityConfig:
    if path is None:
        return CapacityConfig()
    from testbed.reader import load_yaml

    return parse_capacity_config(load_yaml(path), str(path))


def plan(cfg: CapacityConfig, caps: Capacities | None = None) -> dict:
    """The whole calculation as plain data: capacities, both fleets, one row per GPU-B price."""
    caps = caps or capacities_from_cost_model(cfg.workload, cfg.chip_a, cfg.chip_b,
                                              cfg.n_chips)
    pdd, base = size_fleets(cfg.workload, caps, cfg.rld_token_share, cfg.wan_line_gbit)
    rows = []
    for pb in cfg.gpu_b_prices:
        prices = Prices(cfg.gpu_a_price, pb, cfg.wan_line_price)
        rows.append({"gpu_b_price": pb, **compare_fleets(pdd, base, prices, cfg.goodput_ratio)})
    return {"workload": asdict(cfg.workload), "capacities_rps_per_chip": asdict(caps),
            "chips": {"a": cfg.chip_a.name, "b": cfg.chip_b.name, "n_chips": cfg.n_chips},
            "rld_token_share": cfg.rld_token_share, "goodput_ratio": cfg.goodput_ratio,
            "pdd": {"gpu_a": pdd.gpu_a, "gpu_b": pdd.gpu_b, "wan_lines": pdd.wan_lines,
                    **pdd.detail},
            "same_dc_pd": {"gpu_a": base.gpu_a, **base.detail},
            "wan_line_price": cfg.wan_line_price, "prices": rows}


def format_plan(p: dict) -> str:
    """``plan``'s result as a few lines of text (the CLI's output)."""
    c, pdd, base, wl = p["capacities_rps_per_chip"], p["pdd"], p["same_dc_pd"], p["workload"]
    lines = [f"workload: {wl['context_tokens']} tokens, hit {wl['hit_rate']:g}, "
             f"{wl['output_tokens']} out, TPOT SLO {wl['tpot_ms']:g} ms, "
             f"{wl['demand_rps']:g} req/s",
             f"per chip (req/s): prefill {p['chips']['a']} {c['prefill_a']:.4g}, decode "
             f"{p['chips']['a']} {c['decode_a']:.4g}, decode {p['chips']['b']} "
             f"{c['decode_b']:.4g}",
             f"PDD: {pdd['gpu_a']} {p['chips']['a']} (P {pdd['P']}, RLD {pdd['RLD']}) + "
             f"{pdd['gpu_b']} {p['chips']['b']} (MD) + {pdd['wan_lines']} WAN line(s) "
             f"({pdd['wan_gbit']:.3g} Gbit/s offered)",
             f"same-DC PD: {base['gpu_a']} {p['chips']['a']} (P {base['P']}, D {base['D']})"]
    for r in p["prices"]:
        bcr = "" if r["bcr_change_pct"] is None else \
            f", BCR {r['bcr_change_pct']:+.1f}% at goodput x{p['goodput_ratio']:g}"
        lines.append(f"GPU-B at {r['gpu_b_price']:g} x GPU-A, WAN line "
                     f"{p['wan_line_price']:.3g}: cost {r['cost_change_pct']:+.1f}%{bcr}")
    return "\n".join(lines)
