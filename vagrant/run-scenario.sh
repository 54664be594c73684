#!/usr/bin/env bash
# Run a scenario (or any testbed command) as root in the Vagrant VM, whose
# kernel has sch_netem, and copy the run directory back.
#
#   vagrant/run-scenario.sh SCENARIO.yaml [RUN_DIR] [-- TESTBED-RUN-OPTIONS...]
#       testbed run SCENARIO.yaml --out RUN_DIR in the VM; RUN_DIR (default
#       runs/NAME-vm, NAME the file's name) is copied back to the same place
#       here. Example: vagrant/run-scenario.sh scenarios/quickstart.yaml
#
#   vagrant/run-scenario.sh [--fetch RUN_DIR] [--no-sync] -- COMMAND [ARGS...]
#       any command, e.g.
#       vagrant/run-scenario.sh --fetch runs/cal -- \
#           sh -c '.venv/bin/testbed calibrate --json > runs/cal/calibrate.json'
#
# Commands run in the VM's copy of this repository (/testbed) with sudo.
# RUN_DIR is a path inside the repository; it is copied back through
# `vagrant ssh-config` and ssh (tar as root in the VM: run files are
# root-owned), also when the command failed. Before the command,
# `vagrant rsync` pushes local edits (--no-sync skips it).
# Exit code: the command's (testbed run: 0 pass, 1 an expectation failed),
# or 2 for a usage or VM error.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
vm_repo=/testbed
fetch="" sync=1
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }

case "${1:-}" in
  *.yaml|*.yml)
    scenario="$1"; shift
    name="$(basename "$scenario")"; name="${name%.*}"
    fetch="runs/$name-vm"
    if [ $# -gt 0 ] && [ "$1" != "--" ]; then fetch="$1"; shift; fi
    [ "${1:-}" = "--" ] && shift
    set -- .venv/bin/testbed run "$scenario" --out "$fetch" "$@"
    ;;
  *)
    while [ $# -gt 0 ]; do
      case "$1" in
        --fetch) fetch="${2:?--fetch needs a directory}"; shift 2 ;;
        --no-sync) sync=0; shift ;;
        --) shift; break ;;
        -h|--help) usage; exit 0 ;;
        *) break ;;
      esac
    done
    ;;
esac
[ $# -gt 0 ] || { usage >&2; exit 2; }
case "$fetch" in /*|*..*) echo "run-scenario: give RUN_DIR as a path inside the repository" >&2
                          exit 2 ;; esac
command -v vagrant >/dev/null || { echo "run-scenario: vagrant is not installed" >&2; exit 2; }

cd "$here"
vagrant status --machine-readable 2>/dev/null | grep -q ',state,running' \
  || { echo "run-scenario: the VM is not running: cd vagrant && vagrant up" >&2; exit 2; }
if [ "$sync" = 1 ]; then vagrant rsync >/dev/null || exit 2; fi

quoted=$(printf '%q ' "$@")
prep=""
[ -n "$fetch" ] && prep="mkdir -p $(printf '%q' "$fetch") && "
vagrant ssh -c "cd $vm_repo && sudo -H bash -c $(printf '%q' "$prep$quoted")"
rc=$?

if [ -n "$fetch" ]; then
  cfg="$(mktemp)"
  trap 'rm -f "$cfg"' EXIT
  vagrant ssh-config --host testbed-vm > "$cfg" || exit 2
  mkdir -p "$repo/$(dirname "$fetch")"
  if ssh -F "$cfg" testbed-vm "sudo tar -C $vm_repo -cf - $(printf '%q' "$fetch")" \
       | tar -C "$repo" -xf -; then
    echo "run-scenario: copied $fetch back to $repo/$fetch" >&2
  else
    echo "run-scenario: could not copy $fetch back" >&2
    [ "$rc" -eq 0 ] && rc=2
  fi
fi
exit "$rc"
