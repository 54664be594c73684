"""Synthetic multi-turn sessions with a target per-request prefix hit-rate histogram.

Owns ``generate_synthetic``. Everything comes from one numpy Generator seeded
by spec.seed, split (``spawn``) into independent streams for arrivals,
lengths, hit targets, session choice and tokens, so that changing the
arrival process leaves the prompts unchanged.

Lifecycle of a request (the prefill role's cache is unbounded; only prompts
are cached, in 16-token blocks):

1. Draw a target hit fraction h (bin by weight, uniform inside the bin), a
   nominal prompt length L from input_len, an output length, and one of the
   ``concurrent`` open sessions. A session lives for ``turns`` requests,
   then a new one takes its slot. Session s starts from shared system prompt
   s mod shared_prefixes; the very first use of each shared prompt is a
   cold request of max_tokens tokens (hit 0) that puts it in the cache.
2. The session's context is its previous prompt followed by "output-ish"
   tokens (random stand-ins for the previous answer); its first c tokens are
   cached, c = the previous prompt's whole blocks.
3. Continue: if the prompt that keeps all c tokens at hit h (length c / h)
   fits under input_len's max_tokens, the prompt is the context (previous
   prompt + output-ish tokens), cut or padded with fresh user tokens to
   c / h tokens. Hit = c exactly.
4. Rewind otherwise (or h = 0): keep the first p = h * L tokens of the
   context rounded down to whole blocks (p <= c) and append fresh tokens,
   for a prompt of about p / h <= L tokens. Hit = p exactly. When h * L is
   under one block, p = 0 (a fresh prompt), unless the bin excludes 0: then
   p is one block and the prompt 16 / h tokens (at most max_tokens).
5. The new prompt plus output_len output-ish tokens becomes the context.

Lengths are fitted so that p / length falls inside the drawn bin whenever a
one-token change can achieve it (bins narrower than ~1/p cannot always be
hit; prompts of a few hundred tokens suffice for the PDD bins). input_len
therefore sets the length of rewound prompts and the cap of growing
sessions; continuing prompts are longer than L on average. Anomalous
requests (optional) are fresh prompts in sessions of their own.

With ``sessions.warmup``, the shared system prompts start warm: step 1 has no
cold request, and each shared prompt is instead a warm-up request (after the
measured ones, ids n.., arrival 0, ``WARMUP_OUTPUT_TOKENS`` output tokens,
``warmup=True``), which the runner sends and completes before the measured
requests.

Example::

    reqs = generate_synthetic(spec.synthetic)
    reqs[0].arrival_s, len(reqs[0].prompt), reqs[0].designed_hit_rate
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.workload.arrivals import arrival_times
from testbed.workload.cachesim import BLOCK_TOKENS
from testbed.workload.hitrate import HitBin, sample_targets
from testbed.workload.records import WorkloadRequest
from testbed.workload.spec import SyntheticSpec
from testbed.workload.tokens import VOCAB_SIZE, as_prompt


WARMUP_OUTPUT_TOKENS = 16


@dataclass
class _Session:
    id: int
    shared: int  # index of its shared system prompt
    context: np.ndarray  # tokens its next prompt may start with
    cached_tokens: int  # leading tokens of context in the prefix cache (after a turn)
    turns_left: int
    started: bool = False  # False: context is still the shared system prompt


@dataclass(frozen=True)
class _Draws:
    """All per-request random draws, made up front from their own streams."""

    arrival_s: np.ndarray
    bin_idx: np.ndarray
    target: np.ndarray  # hit fraction
    input_len: np.ndarray
    output_len: np.ndarray
    slot: np.ndarray  # which open session
    anomalous: np.ndarray  # bool
    anomalous_input_len: np.ndarray
    anomalous_output_len: np.ndarray


def _draw(spec: SyntheticSpec, streams: list[np.random.Generator]) -> _Draws:
    arr, lens, hits, sess = streams
    times = arrival_times(spec.arrival, arr, n=spec.n_requests, duration_s=spec.duration_s)
    n = len(times)
    idx, target = sample_targets(spec.hit_rate.bins, hits, n)
    an = spec.anomalous
    share = an.share_pct / 100.0 if an else 0.0
    return _Draws(
        arrival_s=times, bin_idx=idx, target=target,
        input_len=spec.input_len.sample(lens, n), output_len=spec.output_len.sample(lens, n),
        slot=sess.integers(spec.sessions.concurrent, size=n),
        anomalous=sess.random(n) < share,
        anomalous_input_len=an.input_len.sample(lens, n) if an else np.zeros(n, np.int64),
        anomalous_output_len=an.output_len.sample(lens, n) if an else np.zeros(n, np.int64))


def fit_length(hit_tokens: int, h: float, b: HitBin) -> int:
    """Prompt length near hit_tokens / h whose hit percentage lies in bin ``b`` if possible.

    Example: ``fit_length(160, 0.95, HitBin(95, 96, 1))`` -> 168 (95.2%).
    """
    base = max(hit_tokens, round(hit_tokens / h))
    for n in (base, base + 1, base - 1):
        if n >= hit_tokens and b.contains(100.0 * hit_tokens / n):
            return n
    return base


class _Builder:
    """Sequential state: shared system prompts, open sessions, the token stream."""

    def __init__(self, spec: SyntheticSpec, rng: np.random.Generator):
        self.spec, self.rng = spec, rng
        self.cap = spec.input_len.max_tokens
        k = spec.sessions.shared_prefixes
        self.shared = [self.fresh(self.cap) for _ in range(k)]
        self.shared_warm = [spec.sessions.warmup] * k
        self.next_session = 0
        self.slots = [self.new_session() for _ in range(spec.sessions.concurrent)]

    def fresh(self, n: int) -> np.ndarray:
        return self.rng.integers(0, VOCAB_SIZE, size=n, dtype=np.int64)

    def new_session(self) -> _Session:
        sid, self.next_session = self.next_session, self.next_session + 1
        k = sid % len(self.shared)
        return _Session(sid, k, self.shared[k], 0, self.spec.sessions.turns)

    def extend(self, context: np.ndarray, n: int) -> np.ndarray:
        """The first n tokens of context, padded with fresh tokens."""
        if n <= len(context):
            return context[:n]
        return np.concatenate([context, self.fresh(n - len(context))])

    def prompt_for(self, s: _Session, h: float, b: HitBin, length: int) -> tuple[np.ndarray, int]:
        """(prompt tokens, designed hit tokens) for one turn of session s."""
        c = s.cached_tokens
        if not s.started:
            if not self.shared_warm[s.shared]:  # cold start: cache the whole system prompt
                self.shared_warm[s.shared] = True
                return s.context, 0
            c = self.cap // BLOCK_TOKENS * BLOCK_TOKENS
        if c > 0 and h > 0:
            grown = fit_length(c, h, b)
            if grown <= self.cap:
                return self.extend(s.context, grown), c
        p = min(c, int(h * length) // BLOCK_TOKENS * BLOCK_TOKENS)
        if p == 0 and b.lo_pct > 0 and BLOCK_TOKENS <= c and BLOCK_TOKENS / h <= self.cap:
            p = BLOCK_TOKENS  # one block is the least a non-zero bin can get
        if p == 0:
            return self.fresh(length), 0
        return self.extend(s.context[:p], min(fit_length(p, h, b), self.cap)), p

    def turn(self, slot: int, h: float, b: HitBin, length: int,
             output_len: int) -> tuple[int, np.ndarray, int]:
        """Advance the session in ``slot``: (session id, prompt, designed hit tokens)."""
        s = self.slots[slot]
        prompt, hit = self.prompt_for(s, h, b, length)
        s.context = np.concatenate([prompt, self.fresh(output_len)])
        s.cached_tokens = len(prompt) // BLOCK_TOKENS * BLOCK_TOKENS
        s.turns_left, s.started = s.turns_left - 1, True
        if s.turns_left == 0:
            self.slots[slot] = self.new_session()
        return s.id, prompt, hit

    def anomalous(self, length: int) -> tuple[int, np.ndarray]:
        sid, self.next_session = self.next_session, self.next_session + 1
        return sid, self.fresh(length)


def generate_synthetic(spec: SyntheticSpec) -> tuple[WorkloadRequest, ...]:
    """Requests in arrival order (then the warm-up requests, if any); deterministic for a
    given spec (seed included).

    Example: ``generate_synthetic(spec) == generate_synthetic(spec)`` is True.
    """
    streams = np.random.default_rng(spec.seed).spawn(5)
    d = _draw(spec, streams[:4])
    builder = _Builder(spec, streams[4])
    bins = spec.hit_rate.bins
    out = []
    for i in range(len(d.arrival_s)):
        if d.anomalous[i]:
            sid, prompt = builder.anomalous(int(d.anomalous_input_len[i]))
            hit, output_len = 0, int(d.anomalous_output_len[i])
        else:
            output_len = int(d.output_len[i])
            sid, prompt, hit = builder.turn(int(d.slot[i]), float(d.target[i]),
                                            bins[d.bin_idx[i]], int(d.input_len[i]), output_len)
        out.append(WorkloadRequest(id=i, arrival_s=float(d.arrival_s[i]), prompt=as_prompt(prompt),
                           output_len=max(1, output_len), session=sid,
                           designed_hit_rate=hit / len(prompt), anomalous=bool(d.anomalous[i])))
    if spec.sessions.warmup:
        n = len(out)
        out += [WorkloadRequest(id=n + k, arrival_s=0.0, prompt=as_prompt(p),
                        output_len=WARMUP_OUTPUT_TOKENS, session=builder.next_session + k, designed_hit_rate=0.0,
                        warmup=True) for k, p in enumerate(builder.shared)]
    return tuple(out)
