"""The token-ID handoff from RLD to MD as two pure state machines (no I/O, no clock).

``RelayHandoff`` is RLD's side of one ``p-rld-md`` request. RLD emits eager
tokens at positions 0, 1, ...; once MD reports KV_READY, RLD hands over
the token ids it emitted (never their KV):

- one-shot: one final batch [0, n); RLD stops decoding at once;
- catch-up: if n > threshold, a non-final batch [0, n) while RLD keeps
  decoding; on each HANDOFF_ACK(next=n) the next batch [n, m) is sent,
  final when m - n <= threshold or when it is batch number
  ``max_batches`` (a bound so that a WAN slower than decoding cannot keep
  the request in catch-up forever).

Phases: DECODING -> (KV_READY) -> CATCHING_UP* -> HANDED_OVER, or
FINISHED_LOCAL when RLD emits the last token first (before any final
batch: MD is then cancelled), also after ``on_md_lost`` (the pipeline
becomes ``p-rld-md->rld``). Exactly-once: RLD emits [0, m) where m is the
final batch's end, MD emits [m, end).

``MainHandoff`` is MD's side: it tracks the next position MD must produce
and the token it predicts there, turns each batch into the token ids to
extend (skipping a prefix already applied, which happens when the router
re-sends RLD's tokens after RLD died), and counts mismatches between MD's
prediction and RLD's token at the same position (exact greedy decoding
makes them 0).

Example::

    rld = RelayHandoff(HandoffMode.CATCH_UP, threshold=64)
    rld.on_emitted(100)
    rld.on_kv_ready()            # HandoffBatch(batch=0, start=0, end=100, final=False)
    rld.on_emitted(130)
    rld.on_ack(0, 100)           # HandoffBatch(batch=1, start=100, end=130, final=True)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from testbed.errors import ProtocolError
from testbed.types import HandoffMode


@dataclass(frozen=True)
class HandoffBatch:
    """Positions [start, end) of one HANDOFF frame."""

    batch: int
    start: int
    end: int
    final: bool

    @property
    def n_tokens(self) -> int:
        return self.end - self.start


class RelayPhase(enum.Enum):
    DECODING = "decoding"  # RLD emits tokens; no batch in flight
    CATCHING_UP = "catching-up"  # a non-final batch is in flight; RLD keeps emitting
    HANDED_OVER = "handed-over"  # final batch sent; RLD emits nothing more
    FINISHED_LOCAL = "finished-local"  # RLD emitted the last token itself


class RelayHandoff:
    """RLD's handoff state of one request (see the module docstring)."""

    def __init__(self, mode: HandoffMode, threshold: int = 64, max_batches: int = 8):
        if threshold < 0 or max_batches < 1:
            raise ValueError(f"threshold {threshold} must be >= 0, max_batches {max_batches} >= 1")
        self.mode, self.threshold, self.max_batches = mode, threshold, max_batches
        self.phase = RelayPhase.DECODING
        self.emitted = 0  # RLD has emitted positions [0, emitted)
        self.sent_end = 0  # batches sent so far cover [0, sent_end)
        self.batches: list[HandoffBatch] = []
        self.md_lost = False

    @property
    def decoding(self) -> bool:
        """RLD must keep decoding this request."""
        return self.phase in (RelayPhase.DECODING, RelayPhase.CATCHING_UP)

    @property
    def pipeline_suffix(self) -> str:
        return "->rld" if self.md_lost else ""

    def on_emitted(self, n_emitted: int) -> None:
        """RLD has now emitted positions [0, n_emitted)."""
        if not self.decoding:
            raise ValueError(f"RLD emitted a token in phase {self.phase.value}")
        if n_emitted < self.emitted:
            raise ValueError(f"emitted count went back from {self.emitted} to {n_emitted}")
        self.emitted = n_emitted

    def on_finished(self) -> bool:
        """RLD emitted the request's last token; True if MD must be told to drop it."""
        if not self.decoding:
            raise ValueError(f"RLD finished a request in phase {self.phase.value}")
        self.phase = RelayPhase.FINISHED_LOCAL
        return not self.md_lost

    def on_kv_ready(self) -> HandoffBatch | None:
        """MD holds the prompt's KV: the first batch to send, or None if too late."""
        if self.phase != RelayPhase.DECODING or self.md_lost or self.batches:
            return None
        return self._next_batch()

    def on_ack(self, batch: int, next_position: int) -> HandoffBatch | None:
        """MD applied ``batch``: the next batch, or None if the ack is stale."""
        if self.phase != RelayPhase.CATCHING_UP:
            return None  # e.g. RLD finished locally or lost MD meanwhile
        last = self.batches[-1]
        if batch != last.batch or next_position != last.end:
            raise ProtocolError(f"HANDOFF_ACK(batch={batch}, next={next_position}) does not "
                                f"match batch {last.batch} ending at {last.end}")
        return self._next_batch()

    def on_md_lost(self) -> bool:
        """MD is gone; True if RLD must (again) decode the request to its end."""
        if self.phase == RelayPhase.FINISHED_LOCAL:
            return False
        self.md_lost = True
        self.phase = RelayPhase.DECODING
        return True

    def _next_batch(self) -> HandoffBatch:
        start, end, number = self.sent_end, self.emitted, len(self.batches)
        final = (self.mode == HandoffMode.ONE_SHOT or end - start <= self.threshold
                 or number + 1 >= self.max_batches)
        batch = HandoffBatch(number, start, end, final)
        self.batches.append(batch)
        self.sent_end = end
        self.phase = RelayPhase.HANDED_OVER if final else RelayPhase.CATCHING_UP
        return batch


@dataclass
class MainHandoff:
    """MD's handoff state of one request: where MD stands and what it predicts next.

    Example::

        md = MainHandoff(first_token=17)
        new = md.plan(0, (17, 4, 9), final=False)   # -> (17, 4, 9): extend these
        md.applied(new, predicted=33, final=False)  # md.next_position == 3
    """

    first_token: int  # P's token 0: MD's prediction for position 0
    next_position: int = 0
    handed: list[int] = field(default_factory=list)  # ids of positions [0, next_position)
    n_batches: int = 0
    mismatches: int = 0
    final: bool = False
    next_token: int = -1

    def __post_init__(self) -> None:
        self.next_token = self.first_token

    def plan(self, start: int, token_ids: tuple[int, ...], final: bool) -> tuple[int, ...]:
        """Token ids of a batch that MD must extend (the part not applied yet).

        ProtocolError if the batch leaves a gap, contradicts applied ids, or
        comes after the final batch.
        """
        if self.final:
            raise ProtocolError("HANDOFF after the final batch")
        if start > self.next_position:
            raise ProtocolError(f"HANDOFF starts at {start}, MD is at {self.next_position}")
        overlap = min(self.next_position - start, len(token_ids))
        if tuple(self.handed[start: start + overlap]) != tuple(token_ids[:overlap]):
            raise ProtocolError(f"HANDOFF re-sends positions from {start} with other ids")
        new = tuple(token_ids[self.next_position - start:])
        if new and new[0] != self.next_token:
            self.mismatches += 1
        return new

    def applied(self, new_ids: tuple[int, ...], predicted: int | None, final: bool) -> None:
        """MD extended ``new_ids`` (``predicted`` = argmax after them; None if none)."""
        if new_ids and predicted is None:
            raise ValueError("an extend of new ids must give the predicted next token")
        self.handed.extend(new_ids)
        self.next_position += len(new_ids)
        if new_ids:
            self.next_token = predicted
        self.n_batches += 1
        self.final = final
