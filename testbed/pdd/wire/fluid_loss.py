"""What a lossy channel costs a TCP stream on the virtual clock's network.

Owns ``PacketLoss`` (one channel direction's loss process, drawn per frame
as netem and the userspace delay line draw it), ``frame_bytes`` (a GSO
frame's size at a rate) and ``recovery`` (the extra
delivery delay and the retransmitted bytes of one write's segment).

The model, per segment of a stream (``testbed/pdd/wire/fluid_net.py`` serves
a write in segments; a segment of ``size`` bytes is size / F frames, a
fraction counting as one more frame with that probability):

0. **What is lost is a frame, not a packet.** The emulator's hosts send TCP
   in GSO frames (TSO autosizing: about 1 ms of the pacing rate, at least 2
   and at most ~44 MSS), and both backends drop whole frames: the userspace
   delay line reads them whole (PACKET_VNET_HDR), and netem counts a GSO skb
   as one packet. Measured: the delay line's WAN a>b in a loss.yaml run
   (suite of 2026-12-07) saw 28,620 frames of 25.3 KB on average. So a "10%
   loss" on the emulator loses 10% of the sender's frames, each a burst of
   up to 44 packets. The model does the same: F = the channel's rate x
   1/1024 s (Linux's pacing shift; the rate stands for the pacing rate),
   between 2 MSS and ``GSO_MAX`` bytes; a small write (a token frame) is one
   frame.
1. **Which frames are lost**: each lossy channel of the path draws its loss
   process over the segment's frames ('random': independent; Gilbert-Elliott:
   a two-state chain advanced per frame, in the order frames cross the
   channel, as netem's ``gemodel`` and the delay line do).
2. **Detection** (RACK-TLP, RFC 8985, Linux's default): a lost frame that
   later packets of the stream follow is marked lost when their SACK arrives,
   one RTT after it was sent (Linux's reordering window is 0 while no
   reordering was seen and three or more packets are SACKed, which a lost
   frame's successor gives: ``tcp_rack_reo_wnd``); it is delivered one RTT
   late, and the stream's later bytes keep flowing meanwhile (only what
   arrives within that RTT waits for it, in order).
   A loss at the stream's tail (the segment's last frame, with nothing
   written after it) is found by the tail loss probe, sent a PTO of 2 SRTT
   after the last packet: 2 RTT late; with one packet in flight Linux adds
   its 200 ms minimum RTO to the PTO, so the RTO (sooner) finds it.
3. **Retransmissions are lost too**, drawn again from the same processes (a
   lost frame is retransmitted as one frame: Linux resends the skb as sent).
   One that later packets follow is found again by RACK (RFC 8985 detects
   lost retransmissions: another RTT); one at the tail waits for the
   retransmission timeout (RFC 6298: RTO = SRTT + max(4 RTTVAR, Linux's 200
   ms minimum), doubled at each further loss), since Linux sends no tail
   loss probe in recovery.
4. **Bytes**: every retransmitted frame is served by the channel again (it
   takes its share of the rate and counts as wire bytes, as htb counts it).

Left out: loss of ACKs (cumulative, rarely costly), reordering, and the
congestion controller's reaction beyond the retransmissions themselves.
Up to ``MAX_MODELED_LOSS_PCT`` the emulated hosts' bbr keeps its rate (one
bulk flow held 97-99% of the line at 1-3%, what the retransmitted bytes
alone give); above it, chains of timeouts collapse its bandwidth estimate,
which this model does not have, so the virtual clock refuses such loss
(``python -m testbed.bench.tcp_loss``, docs/virtual-clock.md, "Loss"). Whether a small write is a stream's tail is judged from the
past: a write that follows another within one RTT counts as followed (a
stream of token frames), one after an idle RTT as a tail.
"""

from __future__ import annotations

import math
import random

from testbed.impairment import LossSpec

MSS = 1448  # payload bytes per packet (timestamps on), as fluid_net's PAYLOAD_SHARE
# the largest GSO frame's payload: 64 KiB less the headers (Linux: GSO_MAX_SIZE - 1 -
# MAX_TCP_HEADER), i.e. 44 full segments
GSO_MAX = 44 * MSS
PACING_SHIFT = 10  # Linux's sk_pacing_shift: a GSO frame holds ~1/1024 s of the pacing rate
RACK_RTTS = 1.0  # a loss that later packets follow: their SACK, one RTT on (reo_wnd 0)
TLP_RTTS = 2.0  # a tail loss: the probe timeout, 2 SRTT (RFC 8985 section 7.2)
# the mean loss the model was checked to (``python -m testbed.bench.tcp_loss`` on both
# clocks, docs/virtual-clock.md): above it the emulator's bbr connections fall into chains
# of retransmission timeouts after which bbr's bandwidth estimate stays low for seconds
# (at 10% random loss 16 MB took 1.0-1.3 s against 0.39 s lossless; the retransmissions
# alone make 0.48 s), which this model does not have: the virtual clock refuses such loss
MAX_MODELED_LOSS_PCT = 3.0
MAX_ROUNDS = 16  # retransmission rounds drawn before giving up drawing (p^16 at most)


class PacketLoss:
    """One channel direction's loss process (``LossSpec``), drawn per packet from the
    network's seeded generator; a Gilbert-Elliott chain keeps its state between draws."""

    def __init__(self, spec: LossSpec, rng: random.Random):
        self.spec, self.rng = spec, rng
        self.bad = False
        self.drawn = 0
        self.lost_packets = 0
        if spec.model == "random":
            self._p = spec.pct / 100.0
        else:
            self._p, self._r = spec.p_pct / 100.0, spec.r_pct / 100.0
            self._bad, self._good = spec.bad_loss_pct / 100.0, spec.good_loss_pct / 100.0

    def draw(self, n: int) -> tuple[int, bool]:
        """Lose packets of a burst of ``n``: (how many, whether the last one was)."""
        if n <= 0:
            return 0, False
        lost, last = (self._random(n) if self.spec.model == "random" else self._gilbert(n))
        self.drawn += n
        self.lost_packets += lost
        return lost, last

    def _random(self, n: int) -> tuple[int, bool]:
        p, rng = self._p, self.rng
        if p <= 0:
            return 0, False
        if p >= 1:
            return n, True
        # the gaps between losses are geometric: one draw a loss, not one a packet
        log_q, i, lost, last = math.log1p(-p), -1, 0, False
        while True:
            i += 1 + int(math.log(1.0 - rng.random()) / log_q)
            if i >= n:
                return lost, last
            lost += 1
            last = i == n - 1

    def _gilbert(self, n: int) -> tuple[int, bool]:
        """netem's loss_gilb_ell, packet by packet: in the bad state, leave it with r
        and lose with 1-h; in the good state, enter bad with p and lose with 1-k."""
        rng, lost, last = self.rng, 0, False
        for i in range(n):
            if self.bad:
                if rng.random() < self._r:
                    self.bad = False
                hit = rng.random() < self._bad
            else:
                if rng.random() < self._p:
                    self.bad = True
                hit = self._good > 0 and rng.random() < self._good
            if hit:
                lost += 1
                last = i == n - 1
        return lost, last


def frame_bytes(rate_bytes_s: float) -> int:
    """The payload of one GSO frame of a flow paced at ``rate_bytes_s`` (TSO autosizing:
    ~1 ms of it, at least 2 MSS, at most ``GSO_MAX``)."""
    return int(min(GSO_MAX, max(2 * MSS, rate_bytes_s / 2 ** PACING_SHIFT // MSS * MSS)))


def _draw(losses: list[PacketLoss], n: int) -> tuple[int, bool]:
    lost, last = 0, False
    for proc in losses:
        k, end = proc.draw(n)
        lost, last = lost + k, last or end
    return min(lost, n), last


def recovery(losses: list[PacketLoss], size: int, tail: bool, rtt_s: float,
             rto_s: float, frame: int = MSS) -> tuple[float, int]:
    """A segment of ``size`` bytes, sent in frames of ``frame`` bytes, over channels
    losing with ``losses``: (how much later than a lossless one it is delivered, bytes
    retransmitted). ``tail``: nothing of the stream follows it."""
    if not losses:
        return 0.0, 0
    frame = min(frame, size)
    # a segment's bytes are size / frame frames: a stream's frames run across the fluid
    # segments' bounds, so the fraction counts as a frame with that probability
    whole, part = divmod(size, frame)
    n = whole + (1 if part and losses[0].rng.random() * frame < part else 0)
    lost, last = _draw(losses, n)
    if not lost:
        return 0.0, 0
    if last and tail:  # a tail loss: the probe, or for a lone packet the RTO
        late = rto_s if size <= MSS else TLP_RTTS * rtt_s
    else:
        late = RACK_RTTS * rtt_s
    resent, backoff = lost, 0
    for _ in range(MAX_ROUNDS):
        again, last = _draw(losses, lost)
        if not again:
            break
        if last and tail:
            late += rto_s * 2 ** backoff
            backoff += 1
        else:
            late += RACK_RTTS * rtt_s
        lost = again
        resent += again
    return late, min(resent * frame, size * (1 + MAX_ROUNDS))
