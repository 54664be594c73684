"""The virtual clock's loss model (testbed/pdd/wire/fluid_loss.py): the draws follow the
configured process, recovery costs what RACK-TLP and the RTO take, and a lossy channel
delays a stream and serves its retransmissions."""

from __future__ import annotations

import asyncio
import random

import pytest

from testbed.impairment import LossSpec
from testbed.pdd.run.vloop import run_virtual
from testbed.pdd.wire.fluid_loss import MSS, RACK_RTTS, TLP_RTTS, PacketLoss, recovery
from testbed.pdd.wire.fluid_net import PAYLOAD_SHARE, FluidNetwork

N = 400_000  # packets drawn: the loss share's standard error is under 0.05 points


def _share(proc: PacketLoss, n: int = N, burst: int = 45) -> float:
    lost = 0
    for _ in range(n // burst):
        lost += proc.draw(burst)[0]
    return lost / (n // burst * burst)


@pytest.mark.parametrize("pct", [1.0, 10.0, 50.0])
def test_random_loss_loses_its_share(pct):
    share = _share(PacketLoss(LossSpec("random", pct=pct), random.Random(1)))
    assert share == pytest.approx(pct / 100, abs=0.003)


def test_gilbert_elliott_loses_its_stationary_share_in_bursts():
    spec = LossSpec("gilbert_elliott", p_pct=5, r_pct=30, bad_loss_pct=50)
    ge = PacketLoss(spec, random.Random(2))
    assert _share(ge) == pytest.approx(spec.mean_pct / 100, abs=0.005)

    def runs(proc) -> float:  # mean length of a run of consecutive lost packets
        seq = [proc.draw(1)[0] for _ in range(100_000)]
        starts = sum(1 for i, x in enumerate(seq) if x and (i == 0 or not seq[i - 1]))
        return sum(seq) / starts
    same_mean = PacketLoss(LossSpec("random", pct=spec.mean_pct), random.Random(2))
    assert runs(PacketLoss(spec, random.Random(3))) > 1.15 * runs(same_mean)


def test_the_last_packet_is_reported_lost_only_when_it_is():
    always = PacketLoss(LossSpec("random", pct=100), random.Random(0))
    never = PacketLoss(LossSpec("random", pct=0.0), random.Random(0))
    assert always.draw(7) == (7, True) and never.draw(7) == (0, False)


class _Script:
    """A loss process that loses what it is told, draw by draw: (lost, last lost)."""

    def __init__(self, *draws: tuple[int, bool]):
        self.draws = list(draws)

    def draw(self, n: int) -> tuple[int, bool]:
        return self.draws.pop(0) if self.draws else (0, False)


RTT, RTO = 0.040, 0.240


@pytest.mark.parametrize("draws, tail, late, resent", [
    ([(0, False)], True, 0.0, 0),                                  # nothing lost
    ([(3, False)], True, RACK_RTTS * RTT, 3),                      # SACKed by later packets
    ([(1, True)], False, RACK_RTTS * RTT, 1),                      # more of the stream follows
    ([(1, True)], True, TLP_RTTS * RTT, 1),                        # a tail loss: the probe
    ([(2, True), (1, True)], True, TLP_RTTS * RTT + RTO, 3),        # its retransmission lost
    ([(2, True), (1, True), (1, True)], True, TLP_RTTS * RTT + 3 * RTO, 4),  # backed off
    ([(4, False), (1, False)], True, 2 * RACK_RTTS * RTT, 5),      # found again by RACK
])
def test_recovery_costs_what_rack_tlp_and_the_rto_take(draws, tail, late, resent):
    got = recovery([_Script(*draws)], 10 * MSS, tail, RTT, RTO)
    assert got[0] == pytest.approx(late) and got[1] == resent * MSS


def test_a_lone_packet_lost_at_the_tail_waits_for_the_rto():
    # Linux's PTO with one packet in flight is 2 SRTT + 200 ms: the RTO comes first
    assert recovery([_Script((1, True))], 100, True, RTT, RTO) == (RTO, 100)
    assert recovery([_Script((1, True))], 100, False, RTT, RTO)[0] == \
        pytest.approx(RACK_RTTS * RTT)


def _transfer(loss: LossSpec | None, n_bytes: int, seed: int = 5) -> tuple[float, int]:
    """One write of ``n_bytes`` over a 0.008 Gbit/s, 20 ms channel: (last byte's arrival,
    wire bytes the channel counted)."""
    net = FluidNetwork(seed=seed)
    ch = net.channel("wan", "a>b", 0.008, 20.0, loss=loss)
    back = net.channel("wan", "b>a", 0.008, 20.0)
    net.route("p", "md", [ch])
    net.route("md", "p", [back])

    async def main():
        pipe = net.pipe("p", "md")
        pipe.put(bytes(n_bytes))
        got = 0
        while got < n_bytes:
            got += len(await pipe.get())
        return asyncio.get_running_loop().time()
    done = run_virtual(main())
    return done, ch.counted_bytes(done)


def test_a_lossy_channel_delays_the_stream_and_serves_its_retransmissions():
    n = 2_000_000
    clean_t, clean_b = _transfer(None, n)
    assert clean_t == pytest.approx(n / (1e6 * PAYLOAD_SHARE) + 0.020)
    lossy_t, lossy_b = _transfer(LossSpec("random", pct=10), n)
    # about a tenth more bytes through the channel, and the time they take plus recovery
    assert lossy_b / clean_b == pytest.approx(1 / 0.9, rel=0.03)
    assert lossy_t > clean_t * 1.08
    # a loss-free draw of the same process costs nothing
    assert _transfer(LossSpec("random", pct=0.0), n) == (clean_t, clean_b)
