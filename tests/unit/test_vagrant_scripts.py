"""vagrant/run-scenario.sh against a stand-in VM (no Vagrant on this machine).

The stand-ins on PATH: ``vagrant`` (status, rsync, ssh -c, ssh-config) and
``ssh`` run their command locally with the VM's /testbed mapped to a
folder of the test; ``sudo`` just runs its command. What is checked is the
script's own work: the command it builds (quoting included), the run
directory copied back to the right place, exit codes, and that nothing
runs when the VM is down.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_VAGRANT = r"""#!/usr/bin/env bash
echo "vagrant $*" >> "$FAKE_LOG"
case "$1" in
  status) echo "1,testbed,state,$FAKE_STATE" ;;
  rsync) ;;
  ssh-config) echo "Host testbed-vm" ;;
  ssh) [ "$2" = "-c" ] || exit 9; cmd="${3/#cd \/testbed /cd $FAKE_VM }"; exec bash -c "$cmd" ;;
  *) exit 9 ;;
esac
"""
FAKE_SSH = r"""#!/usr/bin/env bash
echo "ssh $*" >> "$FAKE_LOG"
cmd="${!#}"; cmd="${cmd/-C \/testbed /-C $FAKE_VM }"; exec bash -c "$cmd"
"""
FAKE_SUDO = """#!/usr/bin/env bash
[ "$1" = "-H" ] && shift
exec "$@"
"""
# The VM's testbed: records its arguments in the run directory, exits 3.
FAKE_TESTBED = r"""#!/usr/bin/env bash
out=""; prev=""
for a in "$@"; do [ "$prev" = "--out" ] && out="$a"; prev="$a"; done
mkdir -p "$out" && printf '%s\n' "$@" > "$out/args"
exit 3
"""


def _exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture()
def stand_in(tmp_path):
    """A copy of vagrant/ in an empty repository, a VM folder, fake tools."""
    repo, vm, bin_ = tmp_path / "repo", tmp_path / "vm", tmp_path / "bin"
    shutil.copytree(REPO / "vagrant", repo / "vagrant")
    for name, text in (("vagrant", FAKE_VAGRANT), ("ssh", FAKE_SSH), ("sudo", FAKE_SUDO)):
        _exe(bin_ / name, text)
    _exe(vm / ".venv" / "bin" / "testbed", FAKE_TESTBED)
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", FAKE_VM=str(vm),
               FAKE_LOG=str(tmp_path / "log"), FAKE_STATE="running")

    def run(*args, state="running"):
        return subprocess.run(["bash", str(repo / "vagrant" / "run-scenario.sh"), *args],
                              env=dict(env, FAKE_STATE=state), capture_output=True, text=True,
                              timeout=30)
    return repo, vm, tmp_path / "log", run


def test_a_scenario_runs_in_the_vm_and_its_run_directory_comes_back(stand_in):
    repo, vm, log, run = stand_in
    r = run("scenarios/quickstart.yaml", "--", "--seed", "7")
    assert r.returncode == 3, r.stderr  # the command's own exit code
    args = (repo / "runs" / "quickstart-vm" / "args").read_text().split("\n")
    assert args[:6] == ["run", "scenarios/quickstart.yaml", "--out", "runs/quickstart-vm",
                        "--seed", "7"]
    assert (vm / "runs" / "quickstart-vm" / "args").is_file()  # made in the VM, copied back
    assert "vagrant rsync" in log.read_text()


def test_a_run_directory_can_be_named_and_arguments_keep_their_quoting(stand_in):
    repo, _, _, run = stand_in
    r = run("scenarios/loss.yaml", "runs/my run")
    assert r.returncode == 3, r.stderr
    assert (repo / "runs" / "my run" / "args").read_text().split("\n")[3] == "runs/my run"
    r = run("--fetch", "runs/x", "--no-sync", "--", "bash", "-c",
            "mkdir -p runs/x && echo \"$0 it's\" > runs/x/said; exit 0", "a b")
    assert r.returncode == 0, r.stderr
    assert (repo / "runs" / "x" / "said").read_text() == "a b it's\n"


def test_nothing_runs_when_the_vm_is_down_or_the_run_directory_is_outside(stand_in):
    repo, vm, log, run = stand_in
    r = run("scenarios/quickstart.yaml", state="poweroff")
    assert r.returncode == 2 and "vagrant up" in r.stderr
    assert not (vm / "runs").exists() and "vagrant ssh" not in log.read_text()
    for bad in ("/tmp/x", "../x"):
        r = run("--fetch", bad, "--", "true")
        assert r.returncode == 2 and "inside the repository" in r.stderr
    assert run().returncode == 2


@pytest.mark.skipif(shutil.which("ruby") is None, reason="needs ruby (apt install ruby)")
def test_the_vagrantfile_parses_and_its_provisioning_calls_the_shared_setup():
    vf = REPO / "vagrant" / "Vagrantfile"
    r = subprocess.run(["ruby", "-c", str(vf)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "Syntax OK" in r.stdout, r.stderr
    text = vf.read_text()
    # one source of truth for packages: the provisioning calls setup.sh and
    # the netem check, and names no package list of its own besides the
    # kernel's extra modules
    assert "./setup.sh" in text and "vagrant/check-netem.sh" in text
