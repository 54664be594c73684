"""testbed/bench/mooncake_wan.py: Mooncake Transfer Engine's probe scripts on loopback (no
namespaces), and the clear refusal where the package is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testbed.bench import mooncake_wan
from testbed.bench.mooncake_wan import PACKAGE, _INITIATOR, _TARGET


def test_without_the_package_the_bench_exits_2_naming_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # import fails
    assert mooncake_wan.main(["--rtt-ms", "40"]) == 2
    assert PACKAGE in capsys.readouterr().err


def test_a_loopback_write_is_timed_and_arrives_intact():
    pytest.importorskip("mooncake.engine",
                        reason=f"{PACKAGE} is not installed (pip install .[mooncake])")
    n = 1 << 20
    target = subprocess.Popen([sys.executable, "-c", _TARGET, "127.0.0.1", str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        hello = json.loads(target.stdout.readline())
        r = subprocess.run([sys.executable, "-c", _INITIATOR, "127.0.0.1", hello["session"],
                            str(hello["buffer"]), json.dumps([4096, n]), "2"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-500:]
        times = json.loads(r.stdout.strip().splitlines()[-1])
        assert times.pop("connections") >= 1  # open to the target when the writes are done
        assert set(times) == {"4096", str(n)}
        assert all(t is not None and 0 < t < 10 for v in times.values() for t in v)
        for seed, ok in ((n % 251, True), (n % 251 + 1, False)):  # the check can fail
            target.stdin.write(f"check {n} {seed}\n")
            target.stdin.flush()
            assert json.loads(target.stdout.readline())["ok"] is ok
    finally:
        target.kill()
        target.wait()
