"""The router's measure of WAN loss: the share of P's segments to MD that TCP retransmitted.

Pure (no I/O, no clock of its own). Fed by P's TCP status (``prefill.py``: every
``prefill.tcp_status_interval_s``, the segments its connections to MD sent and
retransmitted, from the kernel's TCP_INFO); read by the routing rule's lossy-WAN
test (``routing.choose_pipeline``, step 2).

Why the router needs it: the WAN model (``wan_model``) predicts a transfer from the
capacity MD measured, the RTT and the backlog, and learns a margin from the errors of
finished transfers. Random loss escapes all three. A transfer that loses a
retransmission waits for TCP's retransmission timeout (0.2 s at least, doubling) and
restarts from a small window, so its time is a heavy tail that no rate estimate
predicts, and the margin learns it only after some transfers were late. Measured in
``scenarios/loss.yaml`` (10% random loss): 2 of the 4 short p-md transfers routed in
the loss phase were late by 1.1 and 1.9 s after predictions of 0.11-0.18 s, while the
others were on time. The retransmission share shows the loss within one status
interval, before any transfer is late.

Congestion drops count too: a WAN whose queue overflows also loses the retransmission
sometimes. The threshold (``router.lossy_wan_retrans_pct``) sits above what the
scenarios' congestion (standing cross flows, rate drops) made the KV connections
retransmit; docs/pdd-roles.md gives the measured shares.

Example::

    m = LossMeter(window_s=5.0, min_segments=200)
    m.add(now, segs_out=3000, retrans=270)
    m.share(now)  # 0.09
"""

from __future__ import annotations

from collections import deque


class LossMeter:
    """Retransmitted / sent segments over the last ``window_s`` (all P instances' connections
    to every MD: they share one WAN line)."""

    def __init__(self, window_s: float, min_segments: int):
        if window_s <= 0 or min_segments < 1:
            raise ValueError(f"window must be > 0 and min_segments >= 1, got {window_s}, "
                             f"{min_segments}")
        self.window_s, self.min_segments = window_s, min_segments
        self._samples: deque[tuple[float, int, int]] = deque()  # (t, segs_out, retrans)
        self.n_samples = 0

    def add(self, now_s: float, segs_out: int, retrans: int) -> None:
        """One status: ``segs_out`` segments sent since the last one, ``retrans`` of them
        retransmissions. Negative counts (a counter that went back) are refused."""
        if segs_out < 0 or retrans < 0:
            raise ValueError(f"segment counts must be >= 0, got {segs_out}, {retrans}")
        self._samples.append((now_s, segs_out, retrans))
        self.n_samples += 1
        self._expire(now_s)

    def counts(self, now_s: float) -> tuple[int, int]:
        """(segments sent, retransmitted) in the window ending at ``now_s``."""
        self._expire(now_s)
        return (sum(s for _, s, _ in self._samples), sum(r for _, _, r in self._samples))

    def share(self, now_s: float) -> float:
        """Retransmitted / sent in the window; 0.0 when fewer than ``min_segments`` were
        sent (too few to measure a share: a control message's retransmission is not a
        loss rate)."""
        segs, retrans = self.counts(now_s)
        if segs < self.min_segments:
            return 0.0
        return min(1.0, retrans / segs)

    def _expire(self, now_s: float) -> None:
        while self._samples and self._samples[0][0] < now_s - self.window_s:
            self._samples.popleft()
