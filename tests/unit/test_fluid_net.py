"""The virtual clock's network model (testbed/pdd/wire/fluid_net.py), timed exactly.

Every case runs on the virtual clock, so a delivery time is a number, not a
measurement: a channel of 8 Mbit/s carries 1e6 wire bytes a second, of
which PAYLOAD_SHARE are payload.
"""

from __future__ import annotations

import asyncio

import pytest

from testbed import clock
from testbed.pdd.run.vloop import run_virtual
from testbed.pdd.wire.fluid_net import PAYLOAD_SHARE, SNDBUF_BDPS, FluidNetwork

RATE = 1e6 * PAYLOAD_SHARE  # payload bytes per second of a 0.008 Gbit/s channel
KB = 1000


def _net(delay_ms: float = 10.0, **kw) -> tuple[FluidNetwork, object]:
    net = FluidNetwork(seed=3)
    ch = net.channel("wan", "a>b", 0.008, delay_ms, **kw)
    for src in ("p", "q"):
        net.route(src, "md", [ch])
        net.route("md", src, [])
    return net, ch


async def _send_at(pipe, at_s: float, data: bytes) -> None:
    await asyncio.sleep(at_s)
    await pipe.reserve(len(data))
    pipe.put(data)


async def _arrivals(pipe, n_bytes: int) -> list[tuple[float, int]]:
    got, out = 0, []
    while got < n_bytes:
        data = await pipe.get()
        got += len(data)
        out.append((clock.now(), got))
    return out


def _done_at(net, sends: dict[str, list[tuple[float, int]]]) -> dict[str, float]:
    async def main():
        pipes = {src: net.pipe(src, "md") for src in sends}
        for src, plan in sends.items():
            for at, n in plan:
                asyncio.ensure_future(_send_at(pipes[src], at, b"x" * n))
        got = await asyncio.gather(*(_arrivals(pipes[src], sum(n for _, n in plan))
                                     for src, plan in sends.items()))
        return {src: arr[-1][0] for src, arr in zip(sends, got)}
    return run_virtual(main())


def test_one_flow_takes_bytes_over_rate_plus_the_delay():
    net, _ = _net()
    assert _done_at(net, {"p": [(0.0, 100 * KB)]})["p"] == pytest.approx(100 * KB / RATE + 0.010)


def test_two_flows_share_the_rate_equally_not_first_come_first_served():
    net, _ = _net()
    done = _done_at(net, {"p": [(0.0, 200 * KB)], "q": [(0.0, 200 * KB)]})
    # processor sharing: both finish together at twice one's time (FCFS: p at half that)
    assert done["p"] == pytest.approx(400 * KB / RATE + 0.010, rel=1e-6)
    assert done["q"] == pytest.approx(done["p"], rel=1e-6)


def test_a_late_flow_gets_half_the_rate_from_when_it_joins():
    net, _ = _net()
    t1 = 100 * KB / RATE  # p alone has sent 100 KB when q starts
    done = _done_at(net, {"p": [(0.0, 300 * KB)], "q": [(t1, 100 * KB)]})
    assert done["q"] == pytest.approx(t1 + 200 * KB / RATE + 0.010, rel=1e-6)
    assert done["p"] == pytest.approx(t1 + 300 * KB / RATE + 0.010, rel=1e-6)


def test_a_rate_change_acts_on_the_rest_of_a_transfer():
    net, ch = _net()

    async def halve():
        await asyncio.sleep(0.05)
        ch.set(clock.now(), rate_gbit=0.004)

    async def main():
        asyncio.ensure_future(halve())
        pipe = net.pipe("p", "md")
        pipe.put(b"x" * (100 * KB))
        return (await _arrivals(pipe, 100 * KB))[-1][0]

    left = 100 * KB - 0.05 * RATE
    assert run_virtual(main()) == pytest.approx(0.05 + left / (RATE / 2) + 0.010, rel=1e-6)


def test_cross_traffic_flows_take_their_share_and_count_on_the_link():
    net, ch = _net()
    ch.bulk_flows = 3  # three always-backlogged flows: the transfer gets a quarter
    done = _done_at(net, {"p": [(0.0, 50 * KB)]})["p"]
    assert done == pytest.approx(4 * 50 * KB / RATE + 0.010, rel=1e-6)

    async def count():
        await asyncio.sleep(1.0)
        return ch.counted_bytes(clock.now())
    net2, ch2 = _net()
    ch2.bulk_flows = 2
    assert run_virtual(count()) == pytest.approx(1e6, rel=1e-6)  # wire bytes, headers in


def test_segments_arrive_as_they_are_through_not_at_the_frame_end():
    net, _ = _net()

    async def main():
        pipe = net.pipe("p", "md")
        pipe.put(b"x" * (640 * KB))
        return await _arrivals(pipe, 640 * KB)

    arrivals = run_virtual(main())
    assert len(arrivals) == 10  # 64 KiB segments (2 ms of this rate is less)
    first_t, first_n = arrivals[0]
    assert first_t == pytest.approx(first_n / RATE + 0.010, rel=1e-6)


def test_a_full_send_buffer_makes_the_writer_wait_and_a_later_message_waits_only_for_it():
    net = FluidNetwork(seed=1)
    ch = net.channel("wan", "a>b", 0.08, 20.0)  # 10 MB/s wire, RTT 40 ms: BDP 0.4 MB
    net.route("p", "md", [ch])
    net.route("md", "p", [net.channel("wan", "b>a", 0.08, 20.0)])
    rate = 1e7 * PAYLOAD_SHARE

    async def main():
        pipe = net.pipe("p", "md")
        sndbuf = pipe.sndbuf_bytes()
        assert sndbuf == pytest.approx(SNDBUF_BDPS * rate * 0.040)
        t_written = []
        for _ in range(20):  # 20 x 100 KB: far more than the buffer
            await pipe.reserve(100 * KB)
            pipe.put(b"k" * (100 * KB))
            t_written.append(clock.now())
        await pipe.reserve(100)
        pipe.put(b"m" * 100)  # a control message behind the KV
        t_msg = clock.now()
        arrivals = await _arrivals(pipe, 20 * 100 * KB + 100)
        return sndbuf, t_written, t_msg, arrivals

    sndbuf, t_written, t_msg, arrivals = run_virtual(main())
    assert t_written[0] == 0.0 and t_written[-1] > 0.0  # the writer waited for room
    # the message went in once at most a buffer's worth was ahead of it
    assert t_msg == pytest.approx((20 * 100 * KB - sndbuf + 100) / rate, abs=100 * KB / rate)
    assert arrivals[-1][0] == pytest.approx((20 * 100 * KB + 100) / rate + 0.020, rel=1e-6)


def test_one_stream_stays_in_order_under_jitter():
    net, _ = _net(delay_ms=10.0, jitter_ms=8.0)

    async def main():
        pipe = net.pipe("p", "md")
        for i in range(50):
            pipe.put(bytes([i]) * 1000)
        out = b""
        while len(out) < 50_000:
            out += await pipe.get()
        return out

    out = run_virtual(main())
    assert out == b"".join(bytes([i]) * 1000 for i in range(50))


def test_an_unrouted_pair_has_no_delay_and_no_rate():
    net, _ = _net()

    async def main():
        pipe = net.pipe("md", "p")
        pipe.put(b"y" * 10_000_000)
        await pipe.get()
        return clock.now()

    assert run_virtual(main()) == 0.0


def test_frames_travel_as_objects_with_their_size_and_dicts_are_copied():
    from testbed.pdd.wire.fields import Role
    from testbed.pdd.wire.messages import KvChunk, Report
    from testbed.pdd.wire.protocol import Frame, encode_frame_parts

    net, _ = _net()
    listener_seen = []

    async def handler(conn):
        while True:
            try:
                frame = await conn.recv()
                listener_seen.append((clock.now(), frame, conn.bytes_received))
            except Exception:
                return

    async def main():
        listener = await net.host("md").serve("md", 7000, handler)
        conn = await net.host("p").connect("md", 7000)
        chunk = Frame(1, KvChunk(0, 2, 0, 64, b"kv", filler=300_000))
        report = Frame(1, Report(Role.PREFILL, "p", {"x": [1, 2]}))
        await conn.send(chunk)
        await conn.send(report)
        await asyncio.sleep(2.0)
        conn.close()
        listener.close()
        await listener.wait_closed()
        return chunk, report, conn.bytes_sent

    chunk, report, sent = run_virtual(main())
    size = sum(len(p) for p in encode_frame_parts(chunk)[0]) + 300_000
    (t1, got1, rx1), (t2, got2, rx2) = listener_seen[:2]
    assert got1 == chunk  # the same frame
    # connect: one round trip (10 ms there, nothing back), then the bytes and the delay
    assert t1 == pytest.approx(0.010 + size / RATE + 0.010, rel=1e-6)
    assert rx1 == size and sent >= size
    assert got2 == report and got2.message.data is not report.message.data  # a copy


def test_a_link_down_holds_a_connection_that_lost_bytes_until_its_backed_off_rto():
    net, ch = _net()

    async def flap():
        await asyncio.sleep(0.05)
        ch.set(clock.now(), up=False)
        await asyncio.sleep(3.0)
        ch.set(clock.now(), up=True)

    async def main():
        asyncio.ensure_future(flap())
        lost, idle = net.pipe("p", "md"), net.pipe("q", "md")
        lost.put(b"x" * (100 * KB))
        # q writes after the link is back: nothing of it was lost
        asyncio.ensure_future(_send_at(idle, 3.5, b"y" * (10 * KB)))
        a, b = await asyncio.gather(_arrivals(lost, 100 * KB), _arrivals(idle, 10 * KB))
        return a[-1][0], b[-1][0]

    t_lost, t_idle = run_virtual(main())
    rto = 0.010 + 0.2  # the path's RTT (10 ms there, nothing back) + the minimum RTO
    resume = 0.05 + rto * (2 ** 4 - 1)  # 0.26, 0.68, 1.52 < 3.05 (up); 3.2 is the first after
    assert resume > 3.05
    left = 100 * KB - 0.05 * RATE
    assert t_lost == pytest.approx(resume + left / RATE + 0.010, rel=1e-6)
    assert t_idle == pytest.approx(3.5 + 10 * KB / RATE + 0.010, rel=1e-6)
