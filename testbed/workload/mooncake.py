"""Mooncake-format JSONL traces turned into requests with real shared token prefixes.

Owns TraceRow, ``read_trace`` (validates each line), ``select_rows`` (time
window, sampling, limit), ``kept_rows`` (with ``over_context: skip``, less
the requests whose prompt plus output exceed MODEL_CONTEXT_TOKENS after the
divisors, which the run model cannot hold) and ``load_mooncake``. One JSON object per line:
``timestamp`` (ms from the trace start), ``input_length``, ``output_length``
(tokens) and ``hash_ids`` (one id per ``block_tokens``-token block of the
prompt; two requests whose lists share a leading run share that prefix).
Any other key, a wrong type, a hash list whose length is not
ceil(input_length / block_tokens), or a timestamp going backwards is a
SpecError naming the trace file and line.

Tokens: hash id i becomes a fixed block of token IDs (tokens.hashed_tokens),
so equal hash prefixes give equal token prefixes and the prefill role's
radix cache finds the hit. A partial last block is the head of its id's
block. Scaling for small machines: with input_len_divisor d, every hash
block becomes block_tokens / d tokens and a prompt ceil(input_length / d)
tokens (the hash-id prefix structure is kept exactly); outputs become
ceil(output_length / output_len_divisor) tokens, at least 1. Keep
block_tokens / d >= 16 (d <= 32 for 512-token blocks) so that a hash block
is still at least one cache block: at d = 64 the 8-token blocks lose half a
block of every odd-length shared prefix and the first 2,000 conversation
requests measure 26.2% instead of 29.4%.

Per request, ``designed_hit_rate`` is the hash-level hit (leading hash ids
some earlier kept request already had, in tokens); the measured rate in
the Workload stats comes from the 16-token block cache and is a little
lower when hash blocks are not multiples of 16 tokens. ``session`` is
inferred: the session of the earlier request whose blocks this one extends
when at least half of its blocks are shared, else a new one.

Example::

    reqs = load_mooncake(spec, base_dir=Path("scenarios"))   # spec.kind is MOONCAKE
    reqs[0].arrival_s, len(reqs[0].prompt)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from testbed.errors import SpecError
from testbed.reader import is_file
from testbed.strict import finite, parse_json
from testbed.workload.records import WorkloadRequest
from testbed.workload.spec import (MODEL_CONTEXT_TOKENS, MooncakeSpec, WorkloadKind,
                                   WorkloadSpec, error_path)
from testbed.workload.tokens import MAX_HASH_ID, as_prompt, hashed_tokens

TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MAX_TRACE_TOKENS = 10_000_000


@dataclass(frozen=True)
class TraceRow:
    line: int  # 1-based line number in the file
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _is_int(v: object, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def parse_trace_line(file: str, line: int, text: str, block_tokens: int) -> TraceRow:
    """Validate one JSONL line; raises SpecError(file, 'line N: field', ...)."""
    def bad(field: str, expected: str, got: object) -> SpecError:
        return SpecError(file, f"line {line}" + (f": {field}" if field else ""), expected, got)

    obj = parse_json(text, file, f"line {line}", "a JSON object")
    if not isinstance(obj, dict):
        raise bad("", "a JSON object", obj)
    for key in obj:
        if key not in TRACE_FIELDS:
            raise bad(key, "a known field (one of " + ", ".join(TRACE_FIELDS) + ")", key)
    for key in TRACE_FIELDS:
        if key not in obj:
            raise bad(key, "this field to be set", "nothing")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not finite(ts) or ts < 0:
        raise bad("timestamp", "a time in ms >= 0", ts)
    n_in, n_out, ids = obj["input_length"], obj["output_length"], obj["hash_ids"]
    if not _is_int(n_in, 1, MAX_TRACE_TOKENS):
        raise bad("input_length", f"a token count in 1..{MAX_TRACE_TOKENS}", n_in)
    if not _is_int(n_out, 0, MAX_TRACE_TOKENS):
        raise bad("output_length", f"a token count in 0..{MAX_TRACE_TOKENS}", n_out)
    if not isinstance(ids, list) or not all(_is_int(h, 0, MAX_HASH_ID) for h in ids):
        raise bad("hash_ids", f"a list of integer ids in 0..{MAX_HASH_ID}", ids)
    want = -(-n_in // block_tokens)
    if len(ids) != want:
        raise bad("hash_ids", f"{want} ids (one per {block_tokens}-token block of "
                  f"input_length {n_in})", f"{len(ids)} ids")
    return TraceRow(line, float(ts), n_in, n_out, tuple(ids))


def read_trace(path: str | Path, block_tokens: int = 512) -> Iterator[TraceRow]:
    """Yield validated rows lazily (blank lines skipped); timestamps must not decrease.

    Example: ``next(read_trace("trace.jsonl")).hash_ids``.
    """
    file, last = str(path), 0.0
    for line, text in _lines(file):
        if not text.strip():
            continue
        row = parse_trace_line(file, line, text, block_tokens)
        if row.timestamp_ms < last:
            raise SpecError(file, f"line {line}: timestamp",
                            f"a time >= the previous line's ({last:g} ms)", row.timestamp_ms)
        last = row.timestamp_ms
        yield row


def _lines(file: str) -> Iterator[tuple[int, str]]:
    """(1-based number, text) of each line, lazily; SpecError if unreadable or not UTF-8."""
    try:
        fh = open(file, "rb")
    except (OSError, ValueError) as e:
        raise SpecError(file, "", "a readable JSONL trace", getattr(e, "strerror", None)
                        or str(e)) from None
    with fh:
        for line, raw in enumerate(fh, start=1):
            try:
                yield line, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SpecError(file, f"line {line}", "UTF-8 text",
                                raw[e.start:e.start + 4]) from None


def select_rows(rows: Iterable[TraceRow], spec: MooncakeSpec) -> Iterator[TraceRow]:
    """Apply the time window, then sample_every, then sample_pct (seeded), then max_requests."""
    rng = np.random.default_rng(spec.seed)
    start_ms = spec.start_s * 1000.0
    end_ms = math.inf if spec.duration_s is None else start_ms + spec.duration_s * 1000.0
    seen = kept = 0
    for row in rows:
        if row.timestamp_ms > end_ms:
            return
        if row.timestamp_ms < start_ms:
            continue
        seen += 1
        if (seen - 1) % spec.sample_every:
            continue
        if spec.sample_pct < 100.0 and rng.random() >= spec.sample_pct / 100.0:
            continue
        kept += 1
        yield row
        if spec.max_requests and kept >= spec.max_requests:
            return


class _HashTrie:
    """Hash-id prefix tree: which leading ids earlier requests had, and their sessions."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[int, int], tuple[int, int]] = {}  # (parent, id) -> (node, session)
        self.sessions = 0

    def add(self, ids: tuple[int, ...]) -> tuple[int, int]:
        """Insert ids; return (leading ids already present, session of this request)."""
        node, owner, matched = 0, -1, 0
        for h in ids:
            hit = self.nodes.get((node, h))
            if hit is None:
                break
            (node, owner), matched = hit, matched + 1
        if matched == 0 or 2 * matched < len(ids):
            owner, self.sessions = self.sessions, self.sessions + 1
        for h in ids[matched:]:
            child = len(self.nodes) + 1
            self.nodes[(node, h)] = (child, owner)
            node = child
        return matched, owner


def scaled_lengths(row: TraceRow, mc: MooncakeSpec) -> tuple[int, int]:
    """A row's prompt and output in the run's tokens: ceil(length / divisor), the
    output at least 1."""
    return (-(-row.input_length // mc.input_len_divisor),
            max(1, -(-row.output_length // mc.output_len_divisor)))


def kept_rows(spec: WorkloadSpec, path: Path) -> Iterator[TraceRow]:
    """The rows ``select_rows`` keeps, less, with ``over_context: skip``, those whose
    prompt plus output (after the divisors) exceed MODEL_CONTEXT_TOKENS."""
    mc = spec.mooncake
    for row in select_rows(read_trace(path, mc.block_tokens), mc):
        if mc.over_context == "keep" or sum(scaled_lengths(row, mc)) <= MODEL_CONTEXT_TOKENS:
            yield row


def _request(i: int, row: TraceRow, spec: MooncakeSpec, trie: _HashTrie) -> WorkloadRequest:
    block = spec.scaled_block_tokens
    n_in, n_out = scaled_lengths(row, spec)
    matched, session = trie.add(row.hash_ids)
    hit = n_in if matched == len(row.hash_ids) else matched * block
    tokens = hashed_tokens(row.hash_ids, block, n_in)
    return WorkloadRequest(
        id=i,
        arrival_s=(row.timestamp_ms / 1000.0 - spec.start_s) * spec.time_scale,
        prompt=as_prompt(tokens),
        output_len=n_out,
        session=session,
        designed_hit_rate=hit / n_in)


def trace_path(spec: WorkloadSpec, base_dir: str | Path, missing_ok: bool = False) -> Path | None:
    """The trace file of spec.mooncake (relative paths against ``base_dir``); None when
    it is absent and ``missing_ok``, else a SpecError naming the workload's path field."""
    mc = spec.mooncake
    path = Path(mc.path) if Path(mc.path).is_absolute() else Path(base_dir) / mc.path
    if is_file(path):
        return path
    if missing_ok:
        return None
    raise SpecError(spec.file, error_path(spec, "path"), "an existing Mooncake trace file",
                    str(path))


def load_mooncake(spec: WorkloadSpec, base_dir: str | Path = ".") -> tuple[WorkloadRequest, ...]:
    """Requests of the trace named by spec.mooncake; () if it is absent and missing_ok."""
    mc = spec.mooncake
    path = trace_path(spec, base_dir, mc.missing_ok)
    if path is None:
        return ()
    trie = _HashTrie()
    return tuple(_request(i, row, mc, trie) for i, row in enumerate(kept_rows(spec, path)))


# the shipped trace (the mooncake-trace scenario's), for clients that replay it themselves
MOONCAKE_TRACE = Path(__file__).resolve().parents[2] / "scenarios" / "traces" / "mooncake" / \
    "conversation_trace_head1000.jsonl"
MOONCAKE_DIVISOR = 32  # the mooncake-trace scenario's token_scale: 512-token blocks -> 16


def write_client_trace(spec: WorkloadSpec, dst: Path, base_dir: str | Path = ".") -> int:
    """A scenario's Mooncake workload as a Mooncake trace an external client replays
    itself (AIPerf's ``--custom-dataset-type mooncake_trace --fixed-schedule``): the
    rows ``load_mooncake`` keeps (window, sampling, limit), with the scenario's
    scaling applied to the fields the client reads, so the client offers the load
    the scenario's built-in replay offers: ``timestamp`` becomes the scenario's
    arrival time in ms, ``(t / 1000 - start_s) * time_scale * 1000``;
    ``input_length`` and ``output_length`` the scaled token counts
    (``ceil(x / divisor)``, outputs at least 1); ``hash_ids`` unchanged (the client
    rebuilds prompts with ``block_tokens / input_len_divisor``-token blocks, which
    keeps the prefix structure). Returns the rows written; SpecError as
    ``load_mooncake`` (the file names the scenario and the field)."""
    mc, path = spec.mooncake, trace_path(spec, base_dir)
    n = 0
    with open(dst, "w") as fout:
        for row in kept_rows(spec, path):
            n_in, n_out = scaled_lengths(row, mc)
            fout.write(json.dumps({
                "timestamp": round((row.timestamp_ms / 1000.0 - mc.start_s)
                                   * mc.time_scale * 1000.0, 3),
                "input_length": n_in, "output_length": n_out,
                "hash_ids": list(row.hash_ids)}) + "\n")
            n += 1
    return n


def scale_trace(src: Path, dst: Path, rows: int, divisor: int = MOONCAKE_DIVISOR) -> int:
    """The first ``rows`` rows of a Mooncake trace with ``input_length`` divided by
    ``divisor`` (rounded up), hash ids and timestamps as they are, outputs as they
    are (at least 1): the mooncake-trace scenario's token scaling without its
    arrival stretch (``write_client_trace`` applies a scenario's own), for a client
    that rebuilds prompts from hash ids with 512 / ``divisor``-token blocks (AIPerf:
    ``--isl-block-size 16``). Returns the rows written."""
    spec = WorkloadSpec(WorkloadKind.MOONCAKE, "--mooncake-rows", "", mooncake=MooncakeSpec(
        str(src), max_requests=rows, input_len_divisor=divisor))
    return write_client_trace(spec, dst)
