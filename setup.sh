#!/usr/bin/env bash
# One-time (idempotent) set-up on Debian/Ubuntu, as root: system packages,
# a virtualenv in .venv, and the testbed installed into it (editable).
# The README's two commands start with this script.
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES=(mininet bridge-utils iputils-ping iperf3 iproute2 tcpdump strace kmod procps
              qemu-system-x86 busybox-static)  # the last two: the netem VM harness (tests/vm)
# quiet CMD...: run CMD with its output kept in a log; print the log only if it fails
# (a user sees what matters: an error, not apt's and setuptools' chatter).
LOG=$(mktemp -t testbed-setup.XXXXXX)
trap 'rm -f "$LOG"' EXIT
quiet() {
  if ! "$@" >"$LOG" 2>&1; then
    cat "$LOG" >&2
    echo "setup.sh: failed: $*" >&2
    exit 1
  fi
}
if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: run as root (sudo ./setup.sh): it installs system packages" >&2
  exit 2
fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
python3 -m venv --help >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  quiet apt-get update -qq
  quiet env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
quiet .venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned: a plain 'torch' requirement pulls a multi-GB CUDA build.
quiet .venv/bin/python -m pip install -q torch==2.13.0
quiet .venv/bin/python -m pip install -q -e '.[test]'
# Mooncake Transfer Engine (optional: testbed/bench/mooncake_wan.py and its tests): a
# wheel for Linux x86_64 only; where it does not install, those tests skip and say why.
# TESTBED_NO_MOONCAKE=1 leaves it out.
if [ "${TESTBED_NO_MOONCAKE:-0}" != 1 ]; then
  .venv/bin/python -m pip install -q -e '.[mooncake]' >"$LOG" 2>&1 \
    || echo "setup.sh: mooncake-transfer-engine-non-cuda did not install (optional; its tests skip)"
fi
.venv/bin/python -c "import testbed, torch, pyroute2, mininet, scapy, yaml" \
  || { echo "setup.sh: the virtualenv is incomplete" >&2; exit 1; }
echo "setup.sh: ready (.venv/bin/testbed)"
