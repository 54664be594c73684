"""The router's model of the local path P -> RLD (the intra-DC link standing for RDMA).

Owns ``LocalPathModel``: when RLD would hold a relayed request's KV, so the
router can weigh relaying against waiting for the WAN. No I/O and no clock
(every method takes ``now_s``). Nominal units (wire bytes x k), like
``wan_model``.

Why the router needs it: RLD keeps no prefix cache, so a relayed request's
whole prompt crosses the local path, whatever P's hit. For a high-hit
request the WAN carries a few percent of the prompt and the local path all
of it: at 100 Gbit/s a 1,600-token prompt at token_scale 32 (2.6 GB
nominal) takes 0.2 s, as long as its WAN transfer. Relaying such a request
gains nothing, and many at once queue on the local link (measured in
scenarios/pdd-vs-baseline.yaml with every request above a 0.5 s threshold
relayed: 7 high-hit requests relayed within 4 s waited 1.3-2.5 s for
their KV at RLD, longer than the WAN would have taken).

The model: every relayed transfer is ``commit``-ted with its bytes and its
start (P's expected prefill start: with ``prefill.layerwise_local`` the
local path streams the KV while the prefill runs, the cached prefix at
once; otherwise its prefill end), and transfers share the line rate
equally (a fluid processor-sharing queue, ``wan_model.ps_finish_s``). The
backlog is advanced by that fluid model between calls and corrected by
``done`` (RLD emitted its first token: P's KV_DONE reached it). The
prediction (``predict``): the time from P's prefill end until RLD holds
the KV, at least one KV chunk's time after the prefill end (the last
layer's chunk leaves only then), 0 with nothing ahead and an idle link
for a transfer that streams.

Example::

    local = LocalPathModel(line_gbit=100.0)
    local.commit(3, nominal_bytes=2.6e9, start_s=10.0)
    local.predict(now_s=10.0, nominal_bytes=2.6e9, start_s=10.0, prefill_end_s=10.05,
                  tail_bytes=1e8)
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.pdd.roles.wan_model import ps_finish_s


@dataclass
class _LocalTransfer:
    remaining: float  # nominal bytes not yet at RLD (fluid model)
    start_s: float


class LocalPathModel:
    """See the module docstring."""

    def __init__(self, line_gbit: float):
        if line_gbit <= 0:
            raise ValueError(f"local line rate must be > 0, got {line_gbit}")
        self.line_gbit = line_gbit
        self._transfers: dict[int, _LocalTransfer] = {}
        self._t_s: float | None = None  # the fluid state's time

    @property
    def rate_bytes_s(self) -> float:
        return self.line_gbit * 1e9 / 8

    def commit(self, rid: int, nominal_bytes: float, start_s: float) -> None:
        """A relayed transfer of ``nominal_bytes`` starts at ``start_s``."""
        if nominal_bytes > 0:
            self._transfers[rid] = _LocalTransfer(float(nominal_bytes), start_s)

    def done(self, rid: int) -> None:
        """RLD holds ``rid``'s KV (or never will): out of the backlog."""
        self._transfers.pop(rid, None)

    def backlog_bytes(self, now_s: float) -> float:
        self._advance(now_s)
        return sum(t.remaining for t in self._transfers.values())

    @property
    def n_transfers(self) -> int:
        return len(self._transfers)

    def predict(self, now_s: float, nominal_bytes: float, start_s: float, prefill_end_s: float,
                tail_bytes: float = 0.0) -> float:
        """Seconds from ``prefill_end_s`` until RLD would hold a transfer of
        ``nominal_bytes`` starting at ``start_s``; ``tail_bytes`` (the last chunk,
        which leaves only once the prefill has ended) bound it from below."""
        self._advance(now_s)
        others = [(max(now_s, t.start_s), t.remaining) for t in self._transfers.values()
                  if t.remaining > 0]
        finish = ps_finish_s(others, (max(now_s, start_s), float(nominal_bytes)),
                             self.rate_bytes_s, now_s)
        tail = prefill_end_s + tail_bytes / self.rate_bytes_s
        return max(finish, tail) - prefill_end_s

    def _advance(self, now_s: float) -> None:
        """Move the fluid backlog on to ``now_s`` (transfers share the rate once started).

        Each step either ends at the next event time (a start, or ``now_s``) or
        drains the smallest active transfer to exactly 0, so the loop makes at most
        one step per transfer and per start. (It used to subtract ``share * dt``
        with ``dt = remaining / share`` and test ``t < now_s``: rounding could leave
        a residue of a few bytes whose ``dt`` no longer moved a clock of thousands
        of seconds, and the router spun there for good; runs/suite2/loss, caught
        with py-spy.)"""
        t = now_s if self._t_s is None else self._t_s
        self._t_s = max(t, now_s)
        live = [x for x in self._transfers.values() if x.remaining > 0]
        for _ in range(3 * len(live) + 4):
            if t >= now_s:
                return
            active = [x for x in live if x.start_s <= t and x.remaining > 0]
            t_next = min([now_s] + [x.start_s for x in live if x.start_s > t and x.remaining > 0])
            if not active:
                t = t_next
                continue
            share = self.rate_bytes_s / len(active)
            smallest = min(active, key=lambda x: x.remaining)
            if smallest.remaining / share >= t_next - t:  # nobody finishes before t_next
                sent = share * (t_next - t)
                for x in active:
                    x.remaining = max(0.0, x.remaining - sent)
                t = t_next
            else:  # the smallest finishes first: exactly 0, the others lose as much
                sent, dt = smallest.remaining, smallest.remaining / share
                for x in active:
                    x.remaining = 0.0 if x is smallest else max(0.0, x.remaining - sent)
                t = min(t + dt, t_next)
        raise AssertionError("LocalPathModel._advance: more steps than transfers and starts")
