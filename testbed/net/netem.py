"""netem qdisc options: parameters, their netlink encoding, and the pyroute2 glue.

Owns NetemParams (one direction of a link's impairment, in kernel terms), the
exact TCA_OPTIONS layout the kernel's sch_netem expects for it, the delay
distribution tables, and the swap of pyroute2's 'netem' tc plugin. No I/O:
building and encoding are pure; the applier owns the socket.

Lifecycle: a planner builds ``NetemParams`` (validated on construction); the
applier calls ``register()`` once per process, then passes
``netem_request(params)`` as keyword arguments to ``IPRoute.tc``. pyroute2
calls our ``get_parameters`` (plain dict, validated again) and encodes it with
our ``options`` nla class::

    register()
    ipr.tc("replace", kind="netem", index=ifindex, parent="1:10", handle="10:",
           **netem_request(NetemParams(delay_us=10_000, jitter_us=2_000,
                                       distribution="normal", limit_pkts=8334)))

Why a plugin swap: pyroute2 picks the encoder of TCA_OPTIONS by the message's
TCA_KIND (``tcmsg.get_plugin`` reads ``pyroute2.netlink.rtnl.tcmsg.plugins``)
and the request builder (``requests/tc.py``) takes ``get_parameters`` from the
same dict. The kernel only knows kind "netem", so a new key cannot work;
``register()`` replaces ``plugins['netem']`` with ``PLUGIN``. From then on,
in this process, kind 'netem' takes NetemParams field names only (pyroute2's
own ``delay=``/``loss=`` keywords raise PlanError) and dumps decode with the
full attribute map below (LATENCY64, JITTER64, RATE64, SLOT, PRNG_SEED...).

Encoding, in tc's attribute order; byte for byte what iproute2 6.1 ``tc``
sends wherever tc 6.1 can express it (tests/unit/fixtures/netem):
- qopt {latency, limit, loss, gap, duplicate, jitter}: latency/jitter in psched
  ticks of 64 ns (PSCHED_SHIFT 6, /proc/net/psched field 2), as tc computes
  them. The u32 tick field reaches ~274.9 s, not 4.29 s. TCA_NETEM_LATENCY64 /
  JITTER64 (s64 ns, which the kernel lets override the tick field) are added
  only when a value is not a whole number of ticks or overflows the field
  (iproute2 from 2024 on always sends them, with the tick fields 0).
- percentages as tc does: rint(pct / 100 * 0xFFFFFFFF). pyroute2's
  percent2u32 truncates instead and is off by one for e.g. 1 %.
- Gilbert-Elliott (nested TCA_NETEM_LOSS | NLA_F_NESTED, NETEM_LOSS_GE):
  sch_netem in GOOD goes BAD if rnd < p, loses if rnd < k1; in BAD goes GOOD
  if rnd < r, loses if rnd > h. So p = p_pct, r = r_pct, k1 = good_loss_pct,
  h = 0xFFFFFFFF - u32(bad_loss_pct) (tc's "1-h" arithmetic, not u32(100-x)).
- reorder: TCA_NETEM_REORDER, gap 1 (tc's default).
- duplicate: qopt.duplicate, the u32 probability (no correlation attribute).
- TCA_NETEM_PRNG_SEED (u64) before the table, where newer iproute2 puts it
  (tc 6.1 has no seed keyword; kernels without the attribute ignore it).
- TCA_NETEM_DELAY_DIST: 4096 s16, generated here with the arithmetic of
  iproute2's netem/normal.c, pareto.c, paretonormal.c (NIST-PD, from NISTnet),
  equal to the shipped /usr/lib/*/tc/*.dist files. 'uniform' sends no table.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from dataclasses import dataclass

from pyroute2.netlink import NLA_F_NESTED, nla
from pyroute2.netlink.rtnl import TC_H_ROOT
from pyroute2.netlink.rtnl.tcmsg import plugins as _TC_PLUGINS

from testbed.errors import PlanError

U32_MAX = 0xFFFFFFFF
PSCHED_TICK_NS = 64  # kernel PSCHED_TICKS2NS(1): 1 << PSCHED_SHIFT
NETEM_DIST_SCALE = 8192  # table value of one standard deviation


@dataclass(frozen=True)
class NetemParams:
    """One netem qdisc, in netem's units: a plain encoding of the plan's validated
    delay stage (testbed.net.encoders.netem_params builds it from an ``Impairment``,
    whose rules are testbed/impairment.py's) and not checked again. No I/O."""

    delay_us: int = 0  # mean added delay
    jitter_us: int = 0  # spread of the delay; shape from `distribution`
    distribution: str = "uniform"  # a jitter distribution (impairment.py); 'uniform': no table
    loss_model: str = "random"  # random: loss_pct; gilbert_elliott: ge_* fields
    loss_pct: float = 0.0  # independent per-packet loss (loss_model random)
    ge_p_pct: float = 0.0  # GOOD -> BAD transition probability per packet
    ge_r_pct: float = 100.0  # BAD -> GOOD transition probability per packet
    ge_bad_loss_pct: float = 100.0  # loss probability in BAD (tc's 1-h)
    ge_good_loss_pct: float = 0.0  # loss probability in GOOD (tc's 1-k)
    reorder_pct: float = 0.0  # share of packets sent at once, ahead of delayed ones
    duplicate_pct: float = 0.0  # share of packets sent twice (qopt.duplicate)
    limit_pkts: int = 1000  # netem queue length in packets (tc default 1000)
    seed: int | None = None  # netem PRNG seed (TCA_NETEM_PRNG_SEED); None: kernel picks


def netem_request(params: NetemParams) -> dict:
    """Keyword arguments for ``IPRoute.tc(cmd, kind='netem', ...)`` after register().

    >>> netem_request(NetemParams(delay_us=5000))["delay_us"]
    5000
    """
    return dataclasses.asdict(params)


def pct_to_u32(pct: float) -> int:
    """A percentage as the kernel's u32 probability, rounded like tc (rint)."""
    return int(round(pct / 100.0 * U32_MAX))


def _ticks_and_ns64(ns: int) -> tuple[int, int | None]:
    """(legacy u32 tick field, s64 ns attribute or None when ticks are exact)."""
    ticks = ns // PSCHED_TICK_NS
    if ns % PSCHED_TICK_NS == 0 and ticks <= U32_MAX:
        return ticks, None
    return min(ticks, U32_MAX), ns


def encode_options(p: NetemParams) -> dict:
    """NetemParams -> the value of TCA_OPTIONS as our ``options`` class encodes it."""
    latency, latency64 = _ticks_and_ns64(p.delay_us * 1000)
    jitter, jitter64 = _ticks_and_ns64(p.jitter_us * 1000)
    attrs: list = []
    if latency64 is not None:
        attrs.append(["TCA_NETEM_LATENCY64", latency64])
    if jitter64 is not None:
        attrs.append(["TCA_NETEM_JITTER64", jitter64])
    if p.reorder_pct:
        attrs.append(["TCA_NETEM_REORDER",
                      {"probability": pct_to_u32(p.reorder_pct), "correlation": 0}])
    if p.loss_model == "gilbert_elliott":
        ge = {"p": pct_to_u32(p.ge_p_pct), "r": pct_to_u32(p.ge_r_pct),
              "h": U32_MAX - pct_to_u32(p.ge_bad_loss_pct),
              "k1": pct_to_u32(p.ge_good_loss_pct)}
        attrs.append(["TCA_NETEM_LOSS", {"attrs": [["NETEM_LOSS_GE", ge]]}])
    if p.seed is not None:
        attrs.append(["TCA_NETEM_PRNG_SEED", p.seed])
    if p.distribution != "uniform":
        attrs.append(["TCA_NETEM_DELAY_DIST", distribution_table(p.distribution)])
    return {
        "latency": latency,
        "limit": p.limit_pkts,
        "loss": pct_to_u32(p.loss_pct) if p.loss_model == "random" else 0,
        "gap": 1 if p.reorder_pct else 0,
        "duplicate": pct_to_u32(p.duplicate_pct),
        "jitter": jitter,
        "attrs": attrs,
    }


# --- delay distribution tables ------------------------------------------------

_TABLESIZE = 16384  # resolution of the generators' inverse CDF; every 4th is sent


@functools.lru_cache(maxsize=1)
def _normal_quantiles() -> tuple[float, ...]:
    """x where the standard normal CDF rounds to i/16384, i = 0..16384.

    The same scan as netem/normal.c: x from -10 in float steps of 5e-5, the
    last x that lands on an index wins. ~0.4 s, once per process.
    """
    table = [0.0] * (_TABLESIZE + 1)
    x = -10.0
    while x < 10.05:
        table[round(_TABLESIZE * (0.5 + 0.5 * math.erf(x / math.sqrt(2.0))))] = x
        x += 0.00005
    return tuple(table)


def _pareto_value(i: int) -> int:
    """netem/pareto.c's entry for i in 65536, 65520, ... 16 (shape a = 3)."""
    value = 1.0 / math.pow(i / 65536, 1.0 / 3.0)
    value = (value - 1.5) * ((4.0 / 3.0) * NETEM_DIST_SCALE)
    return round(min(value, 32767.0))


def _clamp_s16(value: int) -> int:
    return max(-32768, min(32767, value))


@functools.lru_cache(maxsize=None)
def distribution_table(name: str) -> tuple[int, ...]:
    """The 4096 s16 entries tc sends for ``distribution NAME`` (not 'uniform')."""
    indices = range(0, _TABLESIZE, 4)
    if name == "pareto":
        return tuple(_pareto_value(65536 - 4 * i) for i in indices)
    normal = [round(_normal_quantiles()[i] * NETEM_DIST_SCALE) for i in indices]
    if name == "normal":
        return tuple(_clamp_s16(v) for v in normal)
    if name == "paretonormal":  # (normal + 3 * pareto) / 4, C division truncates
        return tuple(_clamp_s16(int((n + 3 * _pareto_value(65536 - 4 * i)) / 4))
                     for n, i in zip(normal, indices))
    raise PlanError(f"netem: no distribution table for {name!r}")


# --- pyroute2 plugin ------------------------------------------------------------

_TC_KEYS = frozenset({"kind", "index", "handle", "parent", "root", "info", "family"})
_FIELDS = frozenset(f.name for f in dataclasses.fields(NetemParams))


def get_parameters(kwarg: dict) -> dict:
    """pyroute2 request hook: tc() keywords -> TCA_OPTIONS value. Unknown keys raise."""
    unknown = set(kwarg) - _TC_KEYS - _FIELDS
    if unknown:
        raise PlanError(f"netem: unknown tc() keyword(s) {sorted(unknown)}; "
                        f"expected NetemParams fields {sorted(_FIELDS)}")
    return encode_options(NetemParams(**{k: v for k, v in kwarg.items() if k in _FIELDS}))


class options(nla):  # noqa: N801 -- pyroute2 looks the class up by this name
    """TCA_OPTIONS of kind netem: struct tc_netem_qopt, then TCA_NETEM_* attributes."""

    fields = (
        ("latency", "I"),  # psched ticks
        ("limit", "I"),
        ("loss", "I"),
        ("gap", "I"),
        ("duplicate", "I"),
        ("jitter", "I"),  # psched ticks
    )
    nla_map = (  # index = attribute type, as in linux/pkt_sched.h
        ("TCA_NETEM_UNSPEC", "none"),
        ("TCA_NETEM_CORR", "netem_corr"),
        ("TCA_NETEM_DELAY_DIST", "array(int16)"),
        ("TCA_NETEM_REORDER", "netem_prob"),
        ("TCA_NETEM_CORRUPT", "netem_prob"),
        ("TCA_NETEM_LOSS", "netem_loss"),
        ("TCA_NETEM_RATE", "netem_rate"),
        ("TCA_NETEM_ECN", "uint32"),
        ("TCA_NETEM_RATE64", "uint64"),
        ("TCA_NETEM_PAD", "none"),
        ("TCA_NETEM_LATENCY64", "int64"),
        ("TCA_NETEM_JITTER64", "int64"),
        ("TCA_NETEM_SLOT", "netem_slot"),
        ("TCA_NETEM_SLOT_DIST", "array(int16)"),
        ("TCA_NETEM_PRNG_SEED", "uint64"),
    )

    class netem_corr(nla):
        fields = (("delay_corr", "I"), ("loss_corr", "I"), ("dup_corr", "I"))

    class netem_prob(nla):  # struct tc_netem_reorder / tc_netem_corrupt
        fields = (("probability", "I"), ("correlation", "I"))

    class netem_rate(nla):
        fields = (("rate", "I"), ("packet_overhead", "i"),
                  ("cell_size", "I"), ("cell_overhead", "i"))

    class netem_slot(nla):
        fields = (("min_delay", "q"), ("max_delay", "q"), ("max_packets", "i"),
                  ("max_bytes", "i"), ("dist_delay", "q"), ("dist_jitter", "q"))

    class netem_loss(nla):
        nla_flags = NLA_F_NESTED  # tc sets it; the kernel parses either way
        nla_map = (
            ("NETEM_LOSS_UNSPEC", "none"),
            ("NETEM_LOSS_GI", "netem_gimodel"),
            ("NETEM_LOSS_GE", "netem_gemodel"),
        )

        class netem_gimodel(nla):
            fields = (("p13", "I"), ("p31", "I"), ("p32", "I"), ("p14", "I"), ("p23", "I"))

        class netem_gemodel(nla):
            fields = (("p", "I"), ("r", "I"), ("h", "I"), ("k1", "I"))


PLUGIN = types.SimpleNamespace(
    __doc__=__doc__, parent=TC_H_ROOT, get_parameters=get_parameters, options=options)


def register() -> None:
    """Make pyroute2 build and parse kind 'netem' with this module (idempotent).

    >>> register(); from pyroute2.netlink.rtnl.tcmsg import plugins
    >>> plugins["netem"] is PLUGIN
    True
    """
    _TC_PLUGINS["netem"] = PLUGIN
