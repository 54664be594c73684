"""RoleProbe: a blocked event loop shows as lag; pacer overruns reach the stats file."""

from __future__ import annotations

import asyncio
import json
import time

from testbed.pdd.compute.pacing import AsyncPacer
from testbed.pdd.run.probe import RoleProbe, pacer_of


def test_a_blocked_loop_is_recorded_as_lag_and_overruns_as_pacer_counters(tmp_path):
    path = tmp_path / "md1.stats.jsonl"
    pacer = AsyncPacer(time_scale=1.0)

    async def main():
        probe = RoleProbe(path, "md1", "main_decode", pacer)
        probe.start()
        await asyncio.sleep(0.05)
        time.sleep(0.15)  # a forward pass that holds the loop: the probe wakes >= 0.1 s late
        await pacer.pad(0.001, 0.004)  # one step that overran its modeled 1 ms by 3 ms
        await pacer.pad(0.010, 0.001)  # one that did not
        await asyncio.sleep(0.05)
        await probe.stop()

    asyncio.run(main())
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) >= 2  # one at start, one at stop
    last = lines[-1]
    assert last["name"] == "md1" and last["role"] == "main_decode"
    assert last["pacer"] == {"n_steps": 2, "n_overruns": 1, "overrun_s": 0.003,
                             "modeled_s": 0.011}
    assert last["loop_lag"]["max_ms"] >= 100.0
    assert last["loop_lag"]["n"] >= 2
    assert lines[0]["loop_lag"]["n"] <= last["loop_lag"]["n"]


def test_pacer_of_finds_prefills_and_the_decoders_pacers():
    p = AsyncPacer()

    class Prefill:
        pacer = p

    class Decoder:
        pacer = p

    class Decode:
        decoder = Decoder()

    class Router:
        pass

    assert pacer_of(Prefill()) is p and pacer_of(Decode()) is p and pacer_of(Router()) is None


def test_garbage_collector_pauses_are_counted_while_the_probe_runs(tmp_path):
    import gc
    path = tmp_path / "rld1.stats.jsonl"

    async def main():
        probe = RoleProbe(path, "rld1", "relay_decode")
        probe.start()
        junk = [[[i] for i in range(1000)] for _ in range(200)]  # 200k containers to traverse
        gc.collect()
        gc.collect()
        await asyncio.sleep(0.03)
        await probe.stop()
        gc.collect()  # after stop: not counted
        return junk

    asyncio.run(main())
    last = [json.loads(x) for x in path.read_text().splitlines()][-1]
    assert last["gc_pause"]["n"] >= 2  # the two full ones, and the automatic ones the lists made
    assert last["gc_pause"]["sum_ms"] > 0
    assert last["gc_full_pause"]["n"] >= 2  # gc.collect() is a full one
    assert last["gc_full_pause"]["n"] < last["gc_pause"]["n"]  # the lists' were young ones


def test_each_snapshot_carries_the_processs_memory_and_open_descriptors(tmp_path):
    import os
    path = tmp_path / "p1.stats.jsonl"
    held = []

    async def main():
        probe = RoleProbe(path, "p1", "prefill")
        probe.start()
        await asyncio.sleep(0.01)
        probe.write()
        held.extend(os.open(os.devnull, os.O_RDONLY) for _ in range(40))
        held.append(b"\x01" * (64 << 20))  # 64 MB written: resident
        await probe.stop()

    try:
        asyncio.run(main())
    finally:
        for fd in held[:40]:
            os.close(fd)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    before, after = lines[-2], lines[-1]
    assert after["fds"] - before["fds"] == 40
    assert 60 <= after["rss_mb"] - before["rss_mb"] <= 70


def test_each_snapshot_carries_the_main_threads_cpu_time_and_run_delay(tmp_path):
    path = tmp_path / "router.stats.jsonl"

    async def main():
        probe = RoleProbe(path, "router", "router")
        probe.start()
        await asyncio.sleep(0.01)
        probe.write()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.2:  # 200 ms on the CPU
            pass
        await asyncio.sleep(0.2)  # 200 ms asleep: neither counter's
        await probe.stop()

    asyncio.run(main())
    before, after = [json.loads(x) for x in path.read_text().splitlines()][-2:]
    ran = after["cpu_s"] - before["cpu_s"]
    waited = after["run_delay_s"] - before["run_delay_s"]
    # it ran the 200 ms it spun, less any time it waited for a core while spinning
    assert 0.2 - waited - 0.01 <= ran <= 0.3
    assert waited >= 0
