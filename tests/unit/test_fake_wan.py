"""The roles' fake WAN (testbed/pdd/wire/fake_wan.py) shaped by testbed.impairment's LinkSpec:
what it refuses, that jitter keeps the byte order, and that the rate is honoured.

Times are the event loop's clock (``loop.time()``): the fake delivers a write at a
computed loop time, never before it; a loaded machine can only make it later, so the
upper bounds below have a stated slack.
"""

from __future__ import annotations

import asyncio
import statistics

import pytest

from pdd_fixtures import small_config
from testbed.impairment import LinkSpec, LossSpec
from testbed.pdd.wire.fake_wan import ShapedFakeNetwork, wan_network
from testbed.pdd.wire.protocol import Frame, KvChunk, Role, Tokens, encode_frame

SLACK_S = 0.05  # how late a delivery may be on a loaded two-core machine


def run(coro, timeout_s: float = 10.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


@pytest.mark.parametrize("changes, field", [
    (dict(loss=LossSpec("random", pct=1.0)), "loss"),
    (dict(loss=LossSpec("gilbert_elliott", p_pct=1.0, r_pct=25.0)), "loss"),
    (dict(reorder_pct=5.0), "reorder_pct=5"),
    (dict(duplicate_pct=0.5), "duplicate_pct=0.5"),
    (dict(jitter_ms=2.0, jitter_distribution="pareto"), "jitter_distribution='pareto'"),
    (dict(jitter_ms=2.0, jitter_distribution="paretonormal"), "jitter_distribution='paretonormal'"),
])
def test_what_a_reliable_byte_stream_cannot_emulate_is_refused_naming_the_field(changes, field):
    spec = LinkSpec(rate_gbit=1.0, delay_ms=10.0).replace(**changes)
    with pytest.raises(ValueError, match=f"fake WAN: {field}"):
        ShapedFakeNetwork().shape("p", "md", spec)
    with pytest.raises(ValueError, match=f"fake WAN: {field}"):  # at once, not at the first write
        wan_network(small_config(), spec)


def test_an_emulable_link_is_accepted_and_a_non_linkspec_refused():
    net = wan_network(small_config(), LinkSpec(rate_gbit=1000, delay_ms=50))
    assert net.link("p0", "md0").delay_s == pytest.approx(0.05)
    assert net.link("p0", "rld0").delay_s == 0 and net.link("p0", "rld0").rate_bytes_s is None
    with pytest.raises(ValueError, match="LinkSpec"):
        ShapedFakeNetwork().shape("p", "md", {"delay_ms": 5})


def test_jitter_draws_follow_the_distribution():
    net = ShapedFakeNetwork(seed=3)
    net.shape("a", "b", LinkSpec(rate_gbit=1.0, delay_ms=20, jitter_ms=4,
                                 jitter_distribution="uniform"))
    net.shape("b", "a", LinkSpec(rate_gbit=1.0, delay_ms=20, jitter_ms=4,
                                 jitter_distribution="normal"))
    uniform = [net.link("a", "b").jitter() for _ in range(4000)]
    normal = [net.link("b", "a").jitter() for _ in range(4000)]
    assert max(map(abs, uniform)) <= 0.004
    assert statistics.pstdev(uniform) == pytest.approx(0.004 / 3 ** 0.5, rel=0.1)
    assert statistics.pstdev(normal) == pytest.approx(0.004, rel=0.1)  # sigma = jitter_ms
    assert max(map(abs, normal)) > 0.004  # tails beyond +-jitter: not uniform


async def _deliveries(spec: LinkSpec, frames: list[Frame]) -> tuple[float, list[tuple[float, Frame]]]:
    """Send ``frames`` back to back from host p to md over ``spec``; (loop time of the
    first send, [(loop time received, frame)])."""
    loop = asyncio.get_running_loop()
    net = ShapedFakeNetwork(seed=11)
    net.shape("p", "md", spec)
    got: list[tuple[float, Frame]] = []

    async def handler(conn):
        while True:
            frame = await conn.recv()
            got.append((loop.time(), frame))

    async with await net.host("md").serve("md", 0, handler) as listener:
        conn = await net.host("p").connect(*listener.address)
        t0 = loop.time()
        for frame in frames:
            await conn.send(frame)
        while len(got) < len(frames):
            await asyncio.sleep(0.005)
        conn.close()
    return t0, got


def test_normal_jitter_keeps_the_byte_order_and_never_arrives_early():
    # sigma 15 ms on 20 ms: draws differ by far more than the sends' spacing, and some
    # totals would be negative (clipped at 0 added delay)
    spec = LinkSpec(rate_gbit=1.0, delay_ms=20, jitter_ms=15, jitter_distribution="normal")
    frames = [Frame(i, Tokens(Role.MAIN_DECODE, i, (i % 512,))) for i in range(300)]
    t0, got = run(_deliveries(spec, frames))
    assert [f for _, f in got] == frames
    times = [t for t, _ in got]
    assert times == sorted(times)
    assert times[0] >= t0  # the total delay is clipped at >= 0, never negative


def test_the_rate_is_honoured_on_the_loop_clock():
    # ~1 MB at 0.08 Gbit/s (10 MB/s) takes 0.1 s to serialise, then 10 ms of delay
    spec = LinkSpec(rate_gbit=0.08, delay_ms=10, jitter_ms=0)
    frames = [Frame(i, KvChunk(0, 4, 64 * i, 64 * i + 64, bytes([i]) * 1000,
                               filler=250_000 - 1000)) for i in range(4)]
    size = sum(len(encode_frame(f)) for f in frames)
    assert 1_000_000 <= size <= 1_001_000
    t0, got = run(_deliveries(spec, frames))
    assert [f for _, f in got] == frames
    expected_s = size / 10e6 + 0.010  # 0.110 s
    took_s = got[-1][0] - t0
    assert expected_s - 1e-3 <= took_s <= expected_s + SLACK_S
    # the link serialises one frame after the other: the first arrives after a quarter
    first_s = got[0][0] - t0
    assert size / 4 / 10e6 + 0.010 - 1e-3 <= first_s <= size / 4 / 10e6 + 0.010 + SLACK_S
