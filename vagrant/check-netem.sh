#!/usr/bin/env bash
# Does this kernel give the testbed its netem backend? Loads sch_netem, ifb
# and sch_htb, then asks `testbed check --no-measure`, which must report
# "backend netem". Exit 0 yes, 1 no (the reason on stderr).
#
# Run as root; it finds the repository from its own path. Vagrant
# provisioning runs it after setup.sh; tests/vm runs it in the qemu guest
# (Debian's stock kernel), and on a kernel without sch_netem it exits 1.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
for m in sch_netem ifb sch_htb; do
  modprobe "$m" || { echo "check-netem: cannot load kernel module $m" >&2; exit 1; }
done
out=$("$repo/.venv/bin/testbed" check --no-measure) \
  || { echo "check-netem: testbed check failed" >&2; echo "$out" >&2; exit 1; }
echo "$out"
if ! grep -Eq '^backend +netem$' <<<"$out"; then
  echo "check-netem: testbed check does not report the netem backend" >&2
  exit 1
fi
echo "check-netem: ok (sch_netem, ifb, sch_htb loaded; backend netem)"
