"""The VM harness's pure parts: cpio layout, run.sh, module order, judging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.vm.guest import command_script
from testbed.vm.initramfs import Cpio, init_scripts
from testbed.vm.kernel import GuestKernel
from testbed.vm.netem_check import judge, shaper_rows, starting_rate_gbit


def parse_newc(data: bytes) -> list[tuple[str, int, bytes]]:
    out, at = [], 0
    while True:
        assert data[at:at + 6] == b"070701"
        f = [int(data[at + 6 + 8 * i: at + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = f[1], f[6], f[11]
        name = data[at + 110: at + 110 + namesize - 1].decode()
        at = (at + 110 + namesize + 3) & ~3
        if name == "TRAILER!!!":
            return out
        out.append((name, mode, data[at:at + size]))
        at = (at + size + 3) & ~3


def test_cpio_newc_round_trip():
    c = Cpio()
    c.dir("bin")
    c.file("bin/x", b"hello", 0o755)
    c.chardev("dev/console", 5, 1)
    entries = parse_newc(c.finish())
    assert [(n, oct(m)) for n, m, _ in entries] == [
        ("bin", "0o40755"), ("bin/x", "0o100755"), ("dev/console", "0o20600")]
    assert entries[1][2] == b"hello"


def test_run_script_forms(tmp_path):
    assert command_script(["echo", "a b"], tmp_path).splitlines()[1] == "exec echo 'a b'"
    assert command_script("echo $HOME | wc", tmp_path).splitlines()[1] == "echo $HOME | wc"
    script = tmp_path / "s.sh"
    script.write_text("exit 0\n")
    assert command_script(script, tmp_path).splitlines()[1] == f"exec /bin/sh {script}"
    assert command_script("x", tmp_path).startswith(f"cd {tmp_path} || exit 126")


def _kernel(tmp_path: Path) -> GuestKernel:
    mods = tmp_path / "lib/modules/6.1.0-1-amd64"
    mods.mkdir(parents=True)
    (mods / "modules.dep").write_text(
        "kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko\n"
        "kernel/net/9p/9pnet.ko:\nkernel/fs/netfs/netfs.ko:\n"
        "kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio.ko\n")
    (mods / "modules.builtin").write_text("kernel/drivers/virtio/virtio.ko\n")
    return GuestKernel("6.1.0-1-amd64", tmp_path, tmp_path / "vmlinux")


def test_module_order_dependencies_first_builtins_skipped(tmp_path):
    order = [p.name for p in _kernel(tmp_path).load_order(("9pnet_virtio", "9p"))]
    assert order == ["9pnet.ko", "9pnet_virtio.ko", "netfs.ko", "9p.ko"]


def test_init_script_loads_the_given_modules(tmp_path):
    init, stage2 = init_scripts(_kernel(tmp_path).load_order(("9p",)))
    assert "for ko in netfs.ko 9pnet.ko 9p.ko; do" in init
    assert "exec switch_root /newroot" in init and "poweroff -f" in stage2


def _doc(rtt=41.5, rate=90.0, loss=1.2, after="delay 10ms loss 1% rate 50Mbit"):
    checks = [{"name": "rtt_ms", "configured": 40.0, "measured": rtt, "unit": "ms"},
              {"name": "rate_fwd_mbit", "configured": 95.6, "measured": rate, "unit": "Mbit/s"},
              {"name": "loss_fwd_pct", "configured": 1.0, "measured": loss, "unit": "%"}]
    return {"probe": {"backend": "netem"}, "backend": "netem", "scale": 100.0,
            "path_overhead_ms": 1.5, "qdisc_after": after,
            "phases": [{"phase": "configured", "links": [{"link": "wan", "checks": checks}]}]}


@pytest.mark.parametrize("doc, failing", [
    (_doc(), []),
    (_doc(rtt=44.6), ["wan rtt_ms"]),            # 44.6 - 1.5 overhead = 43.1 > 43
    (_doc(rate=85.9), ["wan rate_fwd_mbit"]),    # > 10 % below 95.6
    (_doc(loss=1.6), ["wan loss_fwd_pct"]),
    (_doc(after="delay 20ms rate 100Mbit"), ["tc shows new delay, rate"]),
])
def test_judge_applies_guest_tolerances(doc, failing):
    rows = judge(json.loads(json.dumps(doc)))
    assert [r.name for r in rows if not r.passed] == failing


def test_a_capped_runtime_change_is_looked_for_in_tc():
    doc = _doc(after="delay 10ms rate 14Mbit")
    doc["runtime_change"] = {"delay_ms": 10.0, "rate_gbit": 1.4}
    assert all(r.passed for r in judge(doc))
    doc["qdisc_after"] = "delay 10ms rate 50Mbit"  # the topology's half, not the capped one
    assert [r.name for r in judge(doc) if not r.passed] == ["tc shows new delay, rate"]


@pytest.mark.parametrize("capacity, expected", [
    (400.0, 10.0),   # 100 Mbit/s emulated is at most 0.4 x 400: the topology's rate
    (250.0, 10.0),   # exactly 0.4 x 250 = 100
    (200.0, 8.0),    # 0.4 x 200 = 80 Mbit/s emulated -> 8 Gbit/s nominal at k = 100
    (71.0, 2.8),     # 28.4 -> 28 (even, so its half is whole)
    (3.0, 0.2),      # a starved guest still gets 2 Mbit/s, not 0
])
def test_the_check_starts_below_what_the_guest_carries(capacity, expected):
    assert starting_rate_gbit(10.0, 100.0, capacity) == pytest.approx(expected)


def _light(backlogs, reasons=()):
    return {"phase": "light", "seconds": 6.0, "iperf_mbit": 20.0, "emulated_mbit": 100.0,
            "reads": [(0.5 * i, b) for i, b in enumerate(backlogs)], "shapers": {},
            "network_reasons": list(reasons)}


def _saturated(ratio, backlogged_s=6.5):
    return {"phase": "saturated", "seconds": 30.0, "iperf_mbit": 94.0, "emulated_mbit": 100.0,
            "reads": [], "network_reasons": [],
            "shapers": {"wan/a>b": {"backlogged_s": 3.0, "delivered_ratio": 0.91}},
            "span": {"delivered_ratio": ratio, "seconds": backlogged_s}}


@pytest.mark.parametrize("ph, failing", [
    (_light([0] * 10 + [1514] * 3), []),                  # a packet or two is not a queue
    (_light([0] * 12 + [60_000]), []),                    # one read in 13 (<= 10%)
    (_light([66, 111, 90, 3100, 50_000] * 3), ["wan a>b queued reads"]),  # 6 of 15
    (_light([0] * 12, ["network: shaper wan/a>b delivered 0.1% of its rate over 37.4 s"]),
     ["network verdict"]),
    (_saturated(0.97), []),
    (_saturated(1.06), ["wan a>b delivered"]),            # above the rate: the shaper leaks
    (_saturated(0.94), ["wan a>b delivered"]),
    (_saturated(0.99, backlogged_s=1.5), ["wan a>b delivered"]),  # too little to judge
])
def test_shaper_rows_judge_the_queue_the_rate_limiter_holds(ph, failing):
    assert [r.name for r in shaper_rows(ph) if not r.passed] == failing


def test_the_selftest_splits_each_verdict_into_network_compute_and_host(tmp_path):
    from testbed.report.fidelity import by_part
    from testbed.vm.selftest_summary import main

    fid = {"verdict": "degraded", "reasons": [
        "pdd: compute: p1 overran its modeled time by 3300.0% (99% of 40 steps)",
        "cross-dc-pd: compute: router event loop lag p99 40.0 ms > 5 ms"]}
    parts = by_part(fid)
    assert {k: v["verdict"] for k, v in parts.items()} == {
        "network": "faithful", "compute": "degraded", "host": "faithful"}
    assert parts["compute"]["reasons"] == fid["reasons"]
    net = {"verdict": "degraded", "reasons": [
        "pdd: network: shaper wan/a>b delivered 0.1% of its rate over 37.401 s backlogged"]}
    assert by_part(net)["network"]["verdict"] == "degraded"
    assert by_part({"verdict": None})["network"]["verdict"] is None
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "summary.json").write_text(json.dumps({"fidelity": fid}))
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["--accel", "tcg", f"guest netem={tmp_path / 'g'}",
                     f"host={tmp_path / 'missing'}"]) == 0
    text = buf.getvalue()
    assert "| network | faithful | - |" in text and "| compute | degraded | pdd: compute:" in text
    assert "software emulation" in text and "host: no run" in text
