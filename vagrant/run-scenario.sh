#!/usr/bin/env bash
# Run a testbed command as root in the Vagrant VM (netem kernel) and copy a
# run directory back.
#
#   vagrant/run-scenario.sh [--fetch RUN_DIR] [--no-sync] -- COMMAND [ARGS...]
#
#   vagrant/run-scenario.sh --fetch runs/cal -- \
#       sh -c '.venv/bin/testbed calibrate --json > runs/cal/calibrate.json'
#
# COMMAND runs in /testbed (the VM's copy of this repository) with sudo.
# --fetch RUN_DIR (relative to the repository) is copied back to the same
# place on this host afterwards, also when COMMAND failed: through
# `vagrant ssh-config` and ssh (tar as root in the VM, since run files are
# root-owned). Before the command, `vagrant rsync` pushes local edits
# (--no-sync skips it). Exit code: COMMAND's, or 2 for a usage/VM error.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
fetch="" sync=1
while [ $# -gt 0 ]; do
  case "$1" in
    --fetch) fetch="${2:?--fetch needs a directory}"; shift 2 ;;
    --no-sync) sync=0; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--fetch RUN_DIR] [--no-sync] -- COMMAND..." >&2; exit 2; }
case "$fetch" in /*|*..*) echo "--fetch: give a path inside the repository" >&2; exit 2 ;; esac
command -v vagrant >/dev/null || { echo "vagrant is not installed" >&2; exit 2; }

cd "$here"
vagrant status --machine-readable 2>/dev/null | grep -q ',state,running' \
  || { echo "the VM is not running: cd vagrant && vagrant up" >&2; exit 2; }
if [ "$sync" = 1 ]; then vagrant rsync >/dev/null || exit 2; fi

quoted=$(printf '%q ' "$@")
prep=""
[ -n "$fetch" ] && prep="mkdir -p $(printf '%q' "$fetch") && "
vagrant ssh -c "cd /testbed && sudo -H bash -c $(printf '%q' "$prep$quoted")"
rc=$?

if [ -n "$fetch" ]; then
  cfg="$(mktemp)"
  trap 'rm -f "$cfg"' EXIT
  vagrant ssh-config --host testbed-vm > "$cfg" || exit 2
  mkdir -p "$repo/$(dirname "$fetch")"
  if ssh -F "$cfg" testbed-vm "sudo tar -C /testbed -cf - $(printf '%q' "$fetch")" \
       | tar -C "$repo" -xf -; then
    echo "run-scenario: copied $fetch back to $repo/$fetch" >&2
  else
    echo "run-scenario: could not copy $fetch back" >&2
    [ "$rc" -eq 0 ] && rc=2
  fi
fi
exit "$rc"
