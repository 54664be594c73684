"""The virtual clock: one injected clock for every role, a loop whose time jumps.

testbed/clock.py is the only clock the role packages read; VirtualClockLoop
(testbed/pdd/run/vloop.py) makes it simulated. These tests check that no
role reads the machine's clock itself, that the loop jumps to its timers,
and that the whole in-process cluster runs on it: the same pipelines as on
a real loop, and the same records twice.
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
from pathlib import Path

import pytest

from testbed import clock
from testbed.pdd.run.vloop import VIRTUAL_EPOCH_NS, Stalled, run_virtual

from pdd_fixtures import EXPECTED, run_on_fake_wan, small_config, workload

ROOT = Path(__file__).resolve().parents[2] / "testbed" / "pdd"
# what the roles may still read of the machine: an OpenAI response's "created" (seconds
# since the epoch, for HTTP clients), and a role process's own fidelity probe (run/probe.py
# measures the real loop's lag; it is not in the scanned rooms)
ALLOWED = {("roles/gateway.py", "time.time")}
FORBIDDEN = {"time.monotonic", "time.time", "time.perf_counter", "time.time_ns",
             "time.monotonic_ns", "time.perf_counter_ns", "time.process_time"}


def _clock_reads(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "time" and f"time.{node.attr}" in FORBIDDEN:
            found.add(f"time.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            found |= {f"time.{a.name}" for a in node.names if f"time.{a.name}" in FORBIDDEN}
    return found


def test_no_role_reads_the_machine_clock_itself():
    rooms = ("roles", "compute", "wire", "policy")
    bad = {}
    for room in rooms:
        for path in sorted((ROOT / room).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            reads = {r for r in _clock_reads(path) if (rel, r) not in ALLOWED}
            if reads:
                bad[rel] = sorted(reads)
    assert not bad, f"read testbed.clock instead: {bad}"


def test_the_scan_finds_a_clock_read(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import time\nfrom time import perf_counter\nt = time.monotonic()\n")
    assert _clock_reads(f) == {"time.monotonic", "time.perf_counter"}


def test_sleeps_jump_the_clock_in_order():
    async def main():
        out = []

        async def sleeper(d):
            await asyncio.sleep(d)
            out.append((d, clock.now()))

        t0 = time.perf_counter()
        await asyncio.gather(*(sleeper(d) for d in (5, 1, 3600, 2.5)))
        return out, time.perf_counter() - t0, clock.perf(), clock.wall_ns(), clock.is_virtual()

    out, wall_s, perf_s, wall_ns, virtual = run_virtual(main())
    assert out == [(1, 1.0), (2.5, 2.5), (5, 5.0), (3600, 3600.0)]
    assert wall_s < 5.0  # an hour of simulated time; on a real loop this would take an hour
    assert perf_s == 3600.0 and wall_ns == VIRTUAL_EPOCH_NS + 3600 * 10**9 and virtual


def test_real_loop_reads_the_machine_clock():
    async def main():
        return clock.now(), time.monotonic(), clock.is_virtual()

    t, mono, virtual = asyncio.run(main())
    assert abs(t - mono) < 0.5 and not virtual


def test_executor_work_runs_at_once_and_raises_where_awaited():
    def boom():
        raise KeyError("x")

    async def main():
        value = await asyncio.to_thread(lambda: 42)
        with pytest.raises(KeyError):
            await asyncio.to_thread(boom)
        return value, clock.now()

    assert run_virtual(main()) == (42, 0.0)


def test_a_deadlock_is_named_not_a_hang():
    async def main():
        await asyncio.sleep(2)
        await asyncio.Event().wait()

    with pytest.raises(Stalled, match="stalled at 2.000000 s"):
        run_virtual(main())


def test_cancelled_timers_do_not_move_the_clock():
    async def main():
        far = asyncio.get_running_loop().call_later(100, lambda: None)
        far.cancel()
        await asyncio.sleep(1)
        return clock.now()

    assert run_virtual(main()) == 1.0


@pytest.mark.parametrize("mode", ["pdd", "cross-dc-pd"])
def test_the_cluster_runs_on_the_virtual_clock_and_repeats(mode):
    runs = [run_virtual(run_on_fake_wan(small_config(mode), workload()))[0] for _ in range(2)]
    records = runs[0]
    assert [r["pipeline"] for r in records] == EXPECTED[mode]
    assert all(r["status"] == "completed" and r["tokens_lost"] == 0
               and r["tokens_duplicated"] == 0 for r in records)
    # the WAN's 100 ms round trip is in every p-md first token, and only modeled time is
    if mode == "cross-dc-pd":
        assert min(r["ttft_s"] for r in records) > 0.1
    assert json.dumps(runs[0], sort_keys=True) == json.dumps(runs[1], sort_keys=True)
