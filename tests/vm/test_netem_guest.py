"""The netem backend for real, in a qemu guest (this host has no sch_netem).

Boots Debian 12's kernel under software emulation (testbed.vm) and runs the
project's own probe, build, calibrate and runtime change there; asserts the
guest's figures within the guest tolerances (testbed.vm.netem_check:
RTT +-3 ms after the guest's measured path overhead, rate +-10 % (best of
up to 3 TCP runs), loss +-0.5 points; the shaper as the fidelity verdict
judges it: a lightly loaded link's queue empty and its network verdict
faithful, a saturated link's delivered rate within 5 %). 1.6-2.3 minutes wall on the
reference machine (2 cores), plus ~15 s the first time (kernel download,
initramfs).

Selection (no environment variables): both tests need root,
qemu-system-x86_64 and busybox-static (else skipped); both run in a plain
``pytest -q`` (and so in CI). The accuracy test is marked slow: leave it out
with ``-m "not slow"``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.vm import run_in_guest
from testbed.vm.initramfs import find_busybox
from testbed.vm.netem_check import check_in_guest, format_rows


def _have_busybox() -> bool:
    try:
        find_busybox()
        return True
    except Exception:  # noqa: BLE001 - absence is the answer
        return False


pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the guest reads the host root)"),
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None or not _have_busybox(),
                       reason="needs qemu-system-x86 and busybox-static (apt)"),
]


def _host_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(": ")[1].split("@")[0] for line in out.splitlines()}


def test_guest_runs_a_command_and_reports_back(tmp_path):
    r = run_in_guest("echo out; echo err >&2; uname -r > $PWD/uname; exit 7", tmp_path / "r",
                     timeout_s=180, cwd=tmp_path / "r")
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert (tmp_path / "r" / "uname").read_text().strip().endswith("-amd64")  # the guest's
    assert r.wall_s < 120


@pytest.mark.slow
def test_netem_backend_in_guest_within_tolerance(tmp_path):
    before = _host_links()
    check = check_in_guest(tmp_path / "netem", timeout_s=900)
    table = format_rows(check.rows, check.figures)
    failed = [r for r in check.rows if not r.passed]
    assert not failed, f"outside tolerance:\n{table}"
    names = {(r.phase, r.name) for r in check.rows}
    for phase in ("configured", "after set_link"):  # every figure was measured
        for fig in ("rtt_ms", "rate_fwd_mbit", "rate_rev_mbit"):
            assert (phase, f"wan {fig}") in names, table
    assert ("configured", "wan loss_fwd_pct") in names, table
    # the shaper judged as a run's fidelity verdict judges it: a lightly loaded link's
    # queue empty and its network verdict faithful; a saturated one at its rate +-5%
    assert {("shaper light", "wan a>b queued reads"), ("shaper light", "network verdict"),
            ("shaper saturated", "wan a>b delivered")} <= names, table
    assert check.figures["backend"] == "netem" and check.figures["probe"]["netem"]
    assert _host_links() <= before  # the guest has no way to touch the host's network


CHECK_NETEM = Path(__file__).resolve().parents[2] / "vagrant" / "check-netem.sh"


def test_the_vagrant_provisioning_check_passes_on_a_netem_kernel(tmp_path):
    """vagrant/check-netem.sh (what `vagrant up` runs after setup.sh) in the
    guest: loads sch_netem, ifb, sch_htb; testbed check reports netem."""
    r = run_in_guest(["bash", str(CHECK_NETEM)], tmp_path / "g", timeout_s=300,
                     cwd=tmp_path / "g")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert re.search(r"^backend +netem$", r.stdout, re.M), r.stdout
    assert re.search(r"^qdisc netem +yes$", r.stdout, re.M), r.stdout


def test_the_vagrant_provisioning_check_fails_on_a_kernel_without_netem():
    if Path("/sys/module/sch_netem").exists() or \
            subprocess.run(["modprobe", "-n", "sch_netem"], capture_output=True).returncode == 0:
        pytest.skip("this kernel has sch_netem")
    r = subprocess.run(["bash", str(CHECK_NETEM)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "sch_netem" in r.stderr, r.stderr


def _qemu_pids_for(results) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"tbvm_results={results} "], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


def test_sigterm_to_the_harness_stops_its_guest(tmp_path):
    results = tmp_path / "t"
    proc = subprocess.Popen([sys.executable, "-m", "testbed.vm", "run", "--results",
                             str(results), "--", "sleep", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (results / "guest_uptime").exists() and time.monotonic() < deadline:
        time.sleep(0.5)  # the guest has booted and started the command
    assert _qemu_pids_for(results.resolve()), "no qemu for this test"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "qemu was stopped" in err, err
    assert _qemu_pids_for(results.resolve()) == []
