"""The continuous-batching decode loop (testbed.pdd.compute.decoder) and its pacing."""

from __future__ import annotations

import asyncio
import time

from testbed.pdd.compute.costmodel import GPU_A, CostModel
from testbed.pdd.compute.decoder import DecodeLoop, Seq, warm_model
from testbed.pdd.compute.model import ModelConfig, argmax
from testbed.pdd.compute.pacing import AsyncPacer

CFG = ModelConfig(d_model=64, n_layer=2, n_head=2)


def _seq(model, rid, prompt, max_out):
    logits, cache = model.prefill(prompt)
    return Seq(rid, cache, argmax(logits), 1, max_out)


def test_batched_steps_and_a_joined_extend_give_greedy_tokens_at_modeled_pace():
    model = warm_model(CFG)
    prompts = {1: list(range(1, 40)), 2: list(range(100, 130))}
    got: dict[int, list[int]] = {1: [], 2: []}

    async def sink(emitted):
        for e in emitted:
            assert e.position == len(got[e.seq.rid]) + 1
            got[e.seq.rid].append(e.token_id)

    async def main():
        cost = CostModel(GPU_A)
        loop = DecodeLoop(model, cost, AsyncPacer(time_scale=0.5), sink)
        loop.start()
        seqs = {rid: _seq(model, rid, p, 12) for rid, p in prompts.items()}
        t0 = time.monotonic()
        for s in seqs.values():
            loop.join(s)
        _, other = model.prefill([7] * 20)
        predicted = await loop.extend(other, (1, 2, 3))  # joins a step of the batch
        while loop.active:
            await asyncio.sleep(0.005)
        elapsed = time.monotonic() - t0
        await loop.stop()
        return predicted, elapsed, loop.n_steps, cost.decode_step_s(2, 80) * 0.5

    predicted, elapsed, n_steps, step_s = asyncio.run(main())
    for rid, prompt in prompts.items():
        assert got[rid] == model.greedy_generate(prompt, 12)[1:]
    assert predicted == argmax(model.prefill([7] * 20 + [1, 2, 3])[0])
    assert n_steps == 11  # positions 1..11, the extend rode along in the first step
    assert elapsed >= 0.9 * n_steps * step_s  # every step padded to its modeled time


def test_a_sequence_that_leaves_during_a_step_emits_nothing_more():
    model = warm_model(CFG)
    emitted, loops = [], []

    async def sink(batch):
        emitted.extend(batch)
        loops[0].leave(1)  # e.g. RLD sent its final HANDOFF

    async def main():
        loop = DecodeLoop(model, CostModel(GPU_A), AsyncPacer(time_scale=0.2), sink)
        loops.append(loop)
        loop.start()
        loop.join(_seq(model, 1, [5] * 10, 50))
        await asyncio.sleep(0.1)
        await loop.stop()

    asyncio.run(main())
    assert [e.position for e in emitted] == [1]


def test_an_urgent_extend_does_not_wait_for_a_long_one_queued_before_it():
    """A final handoff batch (urgent) gets a step of its own, without the 200-token catch-up
    batch queued before it; that one runs in the next step, and both predictions are
    exact."""
    model = warm_model(CFG)

    async def main():
        loop = DecodeLoop(model, CostModel(GPU_A, token_scale=32), AsyncPacer(time_scale=0.5),
                          lambda batch: asyncio.sleep(0))
        loop.start()
        _, long_cache = model.prefill([3] * 20)
        _, short_cache = model.prefill([4] * 20)
        done = []
        big = loop.extend(long_cache, tuple(range(1, 201)))
        small = loop.extend(short_cache, (5, 6), urgent=True)
        big.add_done_callback(lambda f: done.append("big"))
        small.add_done_callback(lambda f: done.append("small"))
        results = await asyncio.gather(big, small)
        await loop.stop()
        return done, results, loop.n_steps

    done, (big, small), n_steps = asyncio.run(main())
    assert done == ["small", "big"] and n_steps == 2
    assert big == argmax(model.prefill([3] * 20 + list(range(1, 201)))[0])
    assert small == argmax(model.prefill([4] * 20 + [5, 6])[0])


def test_a_long_catch_up_extend_runs_in_chunks_and_an_urgent_one_cuts_in():
    """chunk_tokens=32: a 100-token non-urgent extend takes 4 steps (32+32+32+4); an urgent
    extend queued meanwhile runs in the next step, before the rest; both exact."""
    model = warm_model(CFG)

    async def main():
        loop = DecodeLoop(model, CostModel(GPU_A), AsyncPacer(time_scale=0.5),
                          lambda batch: asyncio.sleep(0), chunk_tokens=32)
        loop.start()
        _, long_cache = model.prefill([3] * 20)
        _, short_cache = model.prefill([4] * 20)
        order = []
        big = loop.extend(long_cache, tuple(range(1, 101)))
        big.add_done_callback(lambda f: order.append(("big", loop.n_steps)))
        while loop.n_steps < 1:
            await asyncio.sleep(0.001)
        small = loop.extend(short_cache, (5, 6), urgent=True)
        small.add_done_callback(lambda f: order.append(("small", loop.n_steps)))
        results = await asyncio.gather(big, small)
        await loop.stop()
        return order, results

    order, (big, small) = asyncio.run(main())
    assert [name for name, _ in order] == ["small", "big"]
    assert dict(order)["big"] == 5  # 4 chunks + the urgent step in between
    assert big == argmax(model.prefill([3] * 20 + list(range(1, 101)))[0])
    assert small == argmax(model.prefill([4] * 20 + [5, 6])[0])


def test_a_sequence_waits_for_kv_memory_and_starts_when_one_finishes():
    """Capacity for two sequences' footprints: the third waits, first come first served,
    and starts in the step after the first one's last token; its tokens are still the
    greedy ones. On the virtual clock, so every time is exact."""
    from testbed import clock
    from testbed.pdd.run.vloop import run_virtual

    model = warm_model(CFG)
    cost = CostModel(GPU_A, token_scale=32)
    starts: dict[int, float] = {}
    got: dict[int, list[int]] = {1: [], 2: [], 3: []}

    async def sink(emitted):
        for e in emitted:
            starts.setdefault(e.seq.rid, clock.now())
            got[e.seq.rid].append(e.token_id)

    async def main():
        seqs = {1: _seq(model, 1, [5] * 10, 4), 2: _seq(model, 2, [6] * 10, 9),
                3: _seq(model, 3, [7] * 10, 5)}
        # footprint: 10 prompt tokens x 32 + max output
        need = {rid: 320 + s.max_out for rid, s in seqs.items()}
        loop = DecodeLoop(model, cost, AsyncPacer(time_scale=1.0), sink,
                          kv_capacity_tokens=need[1] + need[2])
        assert [loop.footprint(s) for s in seqs.values()] == list(need.values())
        loop.start()
        for s in seqs.values():
            loop.join(s)
        assert set(loop.active) == {1, 2} and set(loop.waiting) == {3} and loop.load == 3
        assert loop.kv_held == need[1] + need[2] and loop.holds(3)
        while loop.load:
            await asyncio.sleep(0.001)
        await loop.stop()
        return loop, seqs

    loop, seqs = run_virtual(main())
    assert got == {1: model.greedy_generate([5] * 10, 4)[1:],
                   2: model.greedy_generate([6] * 10, 9)[1:],
                   3: model.greedy_generate([7] * 10, 5)[1:]}
    # request 1's last token (position 3) ends step 3; request 3 decodes from step 4 on
    assert seqs[3].kv_wait_s > 0 and seqs[1].kv_wait_s == seqs[2].kv_wait_s == 0
    assert starts[3] > starts[1] and seqs[3].kv_wait_s < starts[3]
    assert loop.max_waiting == 1 and loop.kv_held == 0 and not loop.waiting


def test_a_waiting_sequence_can_leave_and_one_larger_than_memory_runs_alone():
    from testbed.pdd.run.vloop import run_virtual

    model = warm_model(CFG)
    done = []

    async def sink(emitted):
        done.extend((e.seq.rid, e.position) for e in emitted if e.finished)

    async def main():
        loop = DecodeLoop(model, CostModel(GPU_A), AsyncPacer(time_scale=1.0), sink,
                          kv_capacity_tokens=5)  # less than any footprint here
        loop.start()
        loop.join(_seq(model, 1, [5] * 10, 3))   # alone: runs although it does not fit
        loop.join(_seq(model, 2, [6] * 10, 3))   # waits
        loop.join(_seq(model, 3, [7] * 10, 3))   # waits behind 2
        assert set(loop.active) == {1} and list(loop.waiting) == [2, 3]
        assert loop.leave(2).rid == 2 and list(loop.waiting) == [3]
        while loop.load:
            await asyncio.sleep(0.001)
        await loop.stop()

    run_virtual(main())
    assert done == [(1, 2), (3, 2)]  # 2 left while waiting: it never decoded
