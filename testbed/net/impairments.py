"""Pure impairment models for the userspace delay line (no sockets, no root).

This module owns what the delay line decides about each frame, with netem's
semantics, so it can be unit-tested with fake clocks and fake frames:

- ``DelayParams``: the frozen parameters of one link direction
  (delay, jitter and its distribution, loss model, reorder share, duplicate
  share, queue limit, seed, up/down), with a JSON round trip; ``check_params`` is
  the pure check of what arrives as JSON (the spec's rules of a delay stage).
- ``jitter_sample``: one draw from netem's delay distributions
  (``JITTER_DISTRIBUTIONS``, testbed/impairment.py), in units of the jitter.
- ``RandomLoss`` / ``GilbertElliottLoss``: the loss models (netem ``loss
  random`` and ``loss gemodel``); ``stationary_loss_pct`` is the analytic rate.
- ``HoldQueue``: the release-time schedule. ``admit`` decides a frame's fate
  (drop for link down, loss or queue limit, else a release time), ``pop_due``
  hands back the frames whose time has come, in release-time order (ties in
  arrival order). Without jitter a frame never leaves before an earlier
  delayed one, even across a delay decrease (netem would reorder there);
  only frames picked by reorder_pct overtake. A frame picked by
  duplicate_pct is held twice, the copy with its own release time (netem's
  duplicate); a frame is what the kernel hands over, a GSO super-frame too.

Lifecycle: the delay line process builds one ``HoldQueue`` from its initial
``DelayParams``; ``set_params`` swaps all parameters at once (held frames keep
their release time; the RNG is reseeded only when the seed changes; the
Gilbert-Elliott chain restarts in the good state, as netem does on change).
Frames still held when the link is down at their release time are dropped.

Example::

    q = HoldQueue(DelayParams(delay_ms=10, loss_pct=1, seed=7))
    q.admit(now_s=0.0, frame=b"...", size=60)   # Verdict.HELD (or DROPPED_LOSS)
    q.pop_due(now_s=0.010)                       # [(b"...", 60)]
"""

from __future__ import annotations

import enum
import heapq
import itertools
import json
import math
import random
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from statistics import NormalDist

from testbed.histogram import LatencyHistogram
from testbed.errors import SpecError
from testbed.impairment import JITTER_DISTRIBUTIONS, LOSS_MODELS, LossSpec, check_delay_stage

# netem's distribution tables run from -4 to +4 (s16 entries / NETEM_DIST_SCALE 8192).
_TABLE_MAX = 32767 / 8192
_PARETO_ALPHA = 3.0
_STD_NORMAL = NormalDist()


# The members are the one list of each (testbed/impairment.py): UNIFORM,
# NORMAL, PARETO, PARETONORMAL; RANDOM, GILBERT_ELLIOTT.
JitterDistribution = enum.StrEnum(
    "JitterDistribution", {name.upper(): name for name in JITTER_DISTRIBUTIONS})
LossModel = enum.StrEnum("LossModel", {name.upper(): name for name in LOSS_MODELS})


class Verdict(enum.Enum):
    HELD = "held"
    DROPPED_LOSS = "dropped_loss"
    DROPPED_LIMIT = "dropped_limit"
    DROPPED_DOWN = "dropped_down"


@dataclass(frozen=True)
class DelayParams:
    """Impairments of one link direction, as the delay line takes them: a plain
    encoding of the plan's validated stage (testbed.net.encoders.delay_params builds
    it from an ``Impairment`` and nothing checks it again). What arrives as JSON
    (the command line, the control socket) is checked by ``from_dict`` against the
    one rule set of a delay stage, testbed/impairment.py's (SpecError naming the
    JSON field), and the line's own fields (limit_pkts, seed, up)."""

    delay_ms: float = field(default=0.0, metadata={"help": "base one-way delay"})
    jitter_ms: float = field(default=0.0, metadata={"help": "jitter scale (netem's jitter)"})
    jitter_distribution: JitterDistribution = field(
        default=JitterDistribution.UNIFORM,
        metadata={"help": " | ".join(JITTER_DISTRIBUTIONS) + " (netem tables)"})
    loss_model: LossModel = field(
        default=LossModel.RANDOM, metadata={"help": " | ".join(LOSS_MODELS)})
    loss_pct: float = field(default=0.0, metadata={"help": "random loss, percent"})
    ge_p_pct: float = field(default=0.0, metadata={"help": "GE good->bad, percent"})
    ge_r_pct: float = field(default=100.0, metadata={"help": "GE bad->good, percent"})
    ge_bad_loss_pct: float = field(default=100.0, metadata={"help": "GE loss in bad (1-h)"})
    ge_good_loss_pct: float = field(default=0.0, metadata={"help": "GE loss in good (1-k)"})
    reorder_pct: float = field(
        default=0.0, metadata={"help": "share of frames sent at once, undelayed"})
    duplicate_pct: float = field(
        default=0.0, metadata={"help": "share of frames sent twice, each copy its own delay"})
    limit_pkts: int = field(default=1000, metadata={"help": "max frames held; more drop"})
    seed: int = field(default=0, metadata={
        "help": "RNG seed, for reproducible runs; give each direction its own seed, "
                "equal seeds make both directions draw the same (correlated) jitter/loss"})
    up: bool = field(default=True, metadata={"help": "false: link down, drop all"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "jitter_distribution",
                           JitterDistribution(self.jitter_distribution))
        object.__setattr__(self, "loss_model", LossModel(self.loss_model))

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, enum.Enum) else v) for k, v in asdict(self).items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> DelayParams:
        """Build from a mapping; unknown keys are errors, missing keys take defaults."""
        if not isinstance(data, dict):
            raise ValueError(f"params: expected a JSON object, got {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"params: unknown field(s) {unknown}, known: {sorted(known)}")
        check_params({**{f.name: f.default for f in fields(cls)}, **data})
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> DelayParams:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"params: not valid JSON ({exc}): {text!r}") from None
        return cls.from_dict(data)


# the JSON field of each field a delay stage's rules name (testbed/impairment.py)
_JSON_NAME = {"loss.model": "loss_model", "loss.pct": "loss_pct", "loss.p_pct": "ge_p_pct",
              "loss.r_pct": "ge_r_pct", "loss.bad_loss_pct": "ge_bad_loss_pct",
              "loss.good_loss_pct": "ge_good_loss_pct"}


def check_params(v: dict) -> None:
    """Check the fields of a DelayParams given as data (``v``: every field): the rules
    of a delay stage are the spec's (SpecError naming the JSON field and its value),
    limit_pkts, seed and up the line's own (ValueError). No I/O."""
    try:
        loss = LossSpec(v["loss_model"], v["loss_pct"], v["ge_p_pct"], v["ge_r_pct"],
                        v["ge_bad_loss_pct"], v["ge_good_loss_pct"])
        check_delay_stage(v["delay_ms"], v["jitter_ms"], v["jitter_distribution"], loss,
                          v["reorder_pct"], v["duplicate_pct"])
    except SpecError as e:
        raise SpecError("delay line params", _JSON_NAME.get(e.path, e.path), e.expected,
                        e.got) from None
    for name, lo in (("limit_pkts", 1), ("seed", 0)):
        value = v[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < lo:
            raise ValueError(f"{name}: expected an integer >= {lo}, got {value!r}")
    if not isinstance(v["up"], bool):
        raise ValueError(f"up: expected true or false, got {v['up']!r}")


def _pareto_quantile(q: float) -> float:
    """iproute2 pareto.c: alpha-3 Pareto, shifted by its mean 1.5, scaled by 4/3, capped."""
    u = max(1.0 - q, 1e-12)
    return min((u ** (-1.0 / _PARETO_ALPHA) - 1.5) * (4.0 / 3.0), _TABLE_MAX)


def jitter_sample(dist: JitterDistribution, rng: random.Random) -> float:
    """One draw of netem's jitter distribution, in units of jitter_ms.

    uniform: U(-1, 1) (netem without a table); normal: N(0, 1) within the
    table's +-4; pareto: iproute2 pareto.c; paretonormal: iproute2
    paretonormal.c, (normal + 3 * pareto) / 4 taken at the same quantile.
    """
    if dist == JitterDistribution.UNIFORM:
        return rng.uniform(-1.0, 1.0)
    if dist == JitterDistribution.NORMAL:
        return max(-_TABLE_MAX, min(_TABLE_MAX, rng.gauss(0.0, 1.0)))
    q = min(max(rng.random(), 1e-12), 1.0 - 1e-12)
    if dist == JitterDistribution.PARETO:
        return _pareto_quantile(q)
    value = (_STD_NORMAL.inv_cdf(q) + 3.0 * _pareto_quantile(q)) / 4.0
    return max(-_TABLE_MAX, min(_TABLE_MAX, value))


class RandomLoss:
    """Independent loss with probability loss_pct (netem ``loss random``)."""

    def __init__(self, loss_pct: float):
        self._p = loss_pct / 100.0

    def lost(self, rng: random.Random) -> bool:
        return self._p > 0 and rng.random() < self._p


class GilbertElliottLoss:
    """netem ``loss gemodel p r 1-h 1-k``: two-state Markov chain.

    Per frame, as in netem's loss_gilb_ell(): draw the state transition, then
    draw the loss with the probability of the state the frame started in.
    """

    def __init__(self, p: DelayParams):
        self._p, self._r = p.ge_p_pct / 100.0, p.ge_r_pct / 100.0
        self._loss_bad, self._loss_good = p.ge_bad_loss_pct / 100.0, p.ge_good_loss_pct / 100.0
        self.bad = False

    def lost(self, rng: random.Random) -> bool:
        if self.bad:
            if rng.random() < self._r:
                self.bad = False
            return rng.random() < self._loss_bad
        if rng.random() < self._p:
            self.bad = True
        return rng.random() < self._loss_good


def make_loss_model(p: DelayParams) -> RandomLoss | GilbertElliottLoss:
    if p.loss_model == LossModel.GILBERT_ELLIOTT:
        return GilbertElliottLoss(p)
    return RandomLoss(p.loss_pct)


def stationary_loss_pct(p: DelayParams) -> float:
    """Long-run loss percentage the parameters imply (analytic)."""
    if p.loss_model == LossModel.RANDOM:
        return p.loss_pct
    if p.ge_p_pct + p.ge_r_pct == 0:
        return p.ge_good_loss_pct  # never leaves the good state it starts in
    share_bad = p.ge_p_pct / (p.ge_p_pct + p.ge_r_pct)
    return share_bad * p.ge_bad_loss_pct + (1.0 - share_bad) * p.ge_good_loss_pct


@dataclass
class LineStats:
    """Counters the delay line reports on ``{"op": "stats"}``."""

    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped_loss: int = 0
    dropped_limit: int = 0
    dropped_down: int = 0
    dropped_tx: int = 0  # the out interface refused the frame (e.g. ENOBUFS)
    dropped_kernel: int = 0  # IF_IN socket buffer overflowed (saturated); not in frames_in
    duplicated: int = 0  # copies made by duplicate_pct (held besides their original)
    # frames timed when read, without the kernel's receive timestamp (testbed.net.delayline)
    unstamped: int = 0
    # how late each sent frame left: its send time minus its release time (the fidelity
    # of the emulated delay; testbed.report.fidelity)
    lateness: LatencyHistogram = field(default_factory=LatencyHistogram)
    realtime: bool = False  # the process runs under SCHED_FIFO (testbed.net.delayline)


class HoldQueue:
    """Release-time schedule of held frames plus the per-frame decisions."""

    def __init__(self, params: DelayParams):
        self.stats = LineStats()
        self._heap: list[tuple[float, int, object, int]] = []
        self._tail_s = -math.inf  # latest release time of a delayed frame
        self._due_release_s: deque[float] = deque()
        self._arrival = itertools.count()
        self._params = params
        self._rng = random.Random(params.seed)
        self._loss = make_loss_model(params)

    @property
    def params(self) -> DelayParams:
        return self._params

    @property
    def held(self) -> int:
        return len(self._heap)

    def set_params(self, params: DelayParams) -> None:
        """Replace all parameters at once; held frames keep their release time."""
        if params.seed != self._params.seed:
            self._rng = random.Random(params.seed)
        self._params = params
        self._loss = make_loss_model(params)

    def _release_time_s(self, now_s: float) -> float:
        """When an admitted frame leaves: now if picked for reordering, else after
        delay (+ jitter). Without jitter, never before an earlier delayed frame."""
        p, rng = self._params, self._rng
        if p.reorder_pct > 0 and rng.random() * 100.0 < p.reorder_pct:
            return now_s
        if p.jitter_ms > 0:
            jitter_ms = p.jitter_ms * jitter_sample(p.jitter_distribution, rng)
            release_s = now_s + max(p.delay_ms + jitter_ms, 0.0) / 1000.0
        else:
            release_s = max(now_s + p.delay_ms / 1000.0, self._tail_s)
        self._tail_s = max(self._tail_s, release_s)
        return release_s

    def admit(self, now_s: float, frame: object, size: int) -> Verdict:
        """Decide one arriving frame's fate; hold it if it survives."""
        st = self.stats
        st.frames_in += 1
        st.bytes_in += size
        if not self._params.up:
            st.dropped_down += 1
            return Verdict.DROPPED_DOWN
        if self._loss.lost(self._rng):
            st.dropped_loss += 1
            return Verdict.DROPPED_LOSS
        if len(self._heap) >= self._params.limit_pkts:
            st.dropped_limit += 1
            return Verdict.DROPPED_LIMIT
        release_s = self._release_time_s(now_s)
        heapq.heappush(self._heap, (release_s, next(self._arrival), frame, size))
        if (self._params.duplicate_pct > 0 and len(self._heap) < self._params.limit_pkts
                and self._rng.random() * 100.0 < self._params.duplicate_pct):
            # netem's duplicate: a copy enqueued again, with its own delay draw
            st.duplicated += 1
            heapq.heappush(self._heap, (self._release_time_s(now_s), next(self._arrival),
                                        frame, size))
        return Verdict.HELD

    def next_release_s(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_s: float) -> list[tuple[object, int]]:
        """Frames (with sizes) whose release time has come; dropped if the link is down."""
        due = []
        self._due_release_s = deque()  # release times of ``due``, consumed by record_sent/_tx_error
        heap = self._heap
        while heap and heap[0][0] <= now_s:
            release_s, _, frame, size = heapq.heappop(heap)
            if self._params.up:
                due.append((frame, size))
                self._due_release_s.append(release_s)
            else:
                self.stats.dropped_down += 1
        return due

    def record_sent(self, size: int, sent_s: float | None = None) -> None:
        """The next frame of the last ``pop_due`` was sent (at ``sent_s``: its lateness,
        sent_s minus its release time, goes to ``stats.lateness``)."""
        self.stats.frames_out += 1
        self.stats.bytes_out += size
        release_s = self._due_release_s.popleft() if self._due_release_s else None
        if sent_s is not None and release_s is not None:
            self.stats.lateness.add_ms((sent_s - release_s) * 1000.0)

    def record_tx_error(self) -> None:
        """The next frame of the last ``pop_due`` was refused by the out interface."""
        self.stats.dropped_tx += 1
        if self._due_release_s:
            self._due_release_s.popleft()

    def stats_dict(self) -> dict:
        counters = {f.name: getattr(self.stats, f.name) for f in fields(self.stats)
                    if f.name != "lateness"}
        return {**counters, "held": self.held, "lateness": self.stats.lateness.to_dict()}
