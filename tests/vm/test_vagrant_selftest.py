"""The Vagrant reproduction for real: vagrant/selftest.sh, end to end.

It installs the VM path's packages if missing, builds (or reuses) the box
from Debian packages, boots it with Vagrant's libvirt provider, provisions
it, runs scenarios/crosscheck.yaml on the netem backend in the guest and on
the userspace backend here, compares them, destroys the VM and checks that
nothing of it is left. 40-60 minutes on a 2-core machine under software
emulation (docs/vagrant.md), so it is opt-in:

    TESTBED_VAGRANT_SELFTEST=1 sudo -E .venv/bin/python -m pytest tests/vm/test_vagrant_selftest.py

It also needs root and a Debian/Ubuntu host (apt-get); without them, or
without the variable, it is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OUT = "runs/vagrant-selftest-pytest"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("TESTBED_VAGRANT_SELFTEST") != "1",
                       reason="opt-in: TESTBED_VAGRANT_SELFTEST=1 (40-60 min, boots a VM)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (libvirt, mmdebstrap)"),
    pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs a Debian/Ubuntu host"),
]


def test_the_vagrant_reproduction_passes_and_leaves_nothing():
    r = subprocess.run(["bash", str(REPO / "vagrant" / "selftest.sh"), OUT], cwd=REPO,
                       capture_output=True, text=True, timeout=3 * 3600)
    summary = (REPO / OUT / "selftest.md").read_text()
    assert r.returncode == 0, r.stderr[-3000:] + summary
    assert "Verdict: passed" in summary
    assert "`backend" in summary and "netem" in summary.split("Guest `testbed check`:")[1].split("\n")[0]
    assert "nothing left" in (REPO / OUT / "leftovers.log").read_text()
    steps = (REPO / OUT / "steps.tsv").read_text().splitlines()[1:]
    assert [s.split("\t")[0] for s in steps] == [
        "host-packages", "host-venv", "libvirt", "box", "accel", "up", "provision",
        "guest-check", "guest-run", "destroy", "host-run", "compare", "leftovers"]
    assert all(s.endswith("\tok") for s in steps), steps
