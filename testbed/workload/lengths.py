"""Token-length distributions for prompts and outputs.

Owns LengthKind, LengthDist, ``parse_length_dist`` and ``LengthDist.sample``.
Every distribution has a finite ``min_tokens`` and ``max_tokens`` (a
lognormal is clipped to them), because the synthetic generator uses the
input maximum as the longest prompt a growing session may reach.

YAML forms (units in the field names, all counts in tokens)::

    {dist: fixed, tokens: 2048}
    {dist: uniform, min_tokens: 512, max_tokens: 4096}          # inclusive
    {dist: lognormal, median_tokens: 2048, sigma: 0.8, max_tokens: 16384, min_tokens: 64}
    {dist: choice, tokens: [1024, 4096], weights: [3, 1]}       # weights optional

Example::

    d = parse_length_dist(Fields({"dist": "fixed", "tokens": 8}, "w.yaml", "input_len"))
    d.sample(np.random.default_rng(0), 3)      # array([8, 8, 8])
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from testbed.errors import SpecError
from testbed.reader import Fields, join

MAX_TOKENS = 1 << 20  # longest prompt/output any distribution may produce


class LengthKind(enum.Enum):
    FIXED = "fixed"
    UNIFORM = "uniform"
    LOGNORMAL = "lognormal"
    CHOICE = "choice"


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts, always within [min_tokens, max_tokens]."""

    kind: LengthKind
    min_tokens: int
    max_tokens: int
    median_tokens: float = 0.0  # lognormal only
    sigma: float = 0.0  # lognormal only: std-dev of ln(tokens)
    choices_tokens: tuple[int, ...] = ()  # choice only
    weights: tuple[float, ...] = ()  # choice only, normalised to sum 1

    @classmethod
    def fixed(cls, tokens: int) -> "LengthDist":
        return cls(LengthKind.FIXED, tokens, tokens)

    @classmethod
    def uniform(cls, min_tokens: int, max_tokens: int) -> "LengthDist":
        return cls(LengthKind.UNIFORM, min_tokens, max_tokens)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws as an int64 array, e.g. ``dist.sample(rng, 100)``."""
        if self.kind is LengthKind.FIXED:
            return np.full(n, self.min_tokens, dtype=np.int64)
        if self.kind is LengthKind.UNIFORM:
            return rng.integers(self.min_tokens, self.max_tokens + 1, size=n, dtype=np.int64)
        if self.kind is LengthKind.LOGNORMAL:
            raw = self.median_tokens * np.exp(self.sigma * rng.standard_normal(n))
            return np.clip(np.rint(raw), self.min_tokens, self.max_tokens).astype(np.int64)
        idx = rng.choice(len(self.choices_tokens), size=n, p=np.asarray(self.weights))
        return np.asarray(self.choices_tokens, dtype=np.int64)[idx]


def _tokens(f: Fields, key: str, default: object = ..., lo: int = 1) -> int:
    return f.int(key, default, lo=lo, hi=MAX_TOKENS)


def _parse_choice(f: Fields) -> LengthDist:
    values = f.list("tokens", min_len=1)
    base = join(f.path, "tokens")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TOKENS:
            raise SpecError(f.file, join(base, i), f"a token count in 1..{MAX_TOKENS}", v)
    weights = f.list("weights", [1] * len(values))
    if len(weights) != len(values):
        raise f.error("weights", f"a list of {len(values)} weights (one per token count)",
                      weights)
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < float("inf"):
            raise SpecError(f.file, join(join(f.path, "weights"), i), "a weight >= 0", w)
    total = float(sum(weights))
    if total <= 0:
        raise f.error("weights", "weights with a positive sum", weights)
    return LengthDist(LengthKind.CHOICE, min(values), max(values),
                      choices_tokens=tuple(values), weights=tuple(w / total for w in weights))


def parse_length_dist(f: Fields) -> LengthDist:
    """Parse one ``{dist: ...}`` mapping (see the module docstring for the forms)."""
    kind = LengthKind(f.choice("dist", tuple(k.value for k in LengthKind)))
    if kind is LengthKind.FIXED:
        dist = LengthDist.fixed(_tokens(f, "tokens"))
    elif kind is LengthKind.UNIFORM:
        lo, hi = _tokens(f, "min_tokens"), _tokens(f, "max_tokens")
        if hi < lo:
            raise f.error("max_tokens", f"a token count >= min_tokens ({lo})", hi)
        dist = LengthDist.uniform(lo, hi)
    elif kind is LengthKind.LOGNORMAL:
        median = f.num("median_tokens", lo=1, hi=MAX_TOKENS, unit="tokens")
        sigma = f.num("sigma", lo=0, hi=5)
        lo, hi = _tokens(f, "min_tokens", 1), _tokens(f, "max_tokens")
        if not lo <= median <= hi:
            raise f.error("median_tokens", f"a median within min_tokens..max_tokens "
                          f"({lo}..{hi})", median)
        dist = LengthDist(LengthKind.LOGNORMAL, lo, hi, median_tokens=median, sigma=sigma)
    else:
        dist = _parse_choice(f)
    f.done()
    return dist
