#!/usr/bin/env bash
# The Vagrant reproduction end to end, as a user would do it, on the box
# vagrant/build-box.sh builds from Debian packages (libvirt provider):
#
#   sudo vagrant/selftest.sh [OUT]          (OUT default runs/vagrant-selftest)
#
# Steps, each timed into OUT/steps.tsv:
#   host-packages  apt-get install what the VM path needs, if missing
#   host-venv      ./setup.sh, if .venv is missing (the box's wheels come from it)
#   libvirt        libvirtd running (started here if not, stopped at the end),
#                  the storage pool "default" defined and active
#   accel          KVM if a guest kernel boots under it within 30 s, else
#                  software emulation (tcg); TESTBED_VM_ACCEL=kvm|tcg skips the probe
#   box            vagrant/build-box.sh (reused when current)
#   up             vagrant up --no-provision (rsyncs the repository to /testbed)
#   provision      setup.sh and vagrant/check-netem.sh in the guest
#   guest-check    `testbed check` in the guest: must report the netem backend
#   guest-run      vagrant/run-scenario.sh scenarios/crosscheck.yaml on netem,
#                  its run directory copied back to OUT/crosscheck-netem
#   destroy        vagrant destroy -f
#   host-run       the same scenario here on the userspace backend (after the
#                  VM is gone, so the two never share the CPU): OUT/crosscheck-userspace
#   compare        testbed compare of the two runs: OUT/compare.md
#   leftovers      no domain, volume, libvirt network, interface, qemu process
#                  or ssh listener of this run is left (OUT/leftovers.txt)
# OUT/selftest.md sums it up, each run's fidelity verdict split into network,
# compute and host (testbed/vm/selftest_summary.py). Exit 0 when every step held, 1 when one
# failed (the rest of the steps that clean up still run), 2 usage.
# Ctrl-C (or SIGTERM) destroys the VM and stops what this script started.
#
# Kept on purpose between runs: the box (in Vagrant and, as vagrant-libvirt's
# uploaded copy, in the pool), the pool's definition, the installed packages.
# Environment: TESTBED_VM_CPUS (default: this host's cores),
# TESTBED_VM_MEMORY_MB (default 6144), TESTBED_VM_SSH_PORT (default 2722).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
cd "$repo"
case "${1:-}" in -h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
OUT="${1:-runs/vagrant-selftest}"
case "$OUT" in /*|*..*) echo "selftest: give OUT as a path inside the repository" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "selftest: run as root (libvirt, mmdebstrap, the scenario)" >&2; exit 2; }

SCENARIO=scenarios/crosscheck.yaml
HOST_PACKAGES=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients
               qemu-system-x86 qemu-utils mmdebstrap extlinux syslinux-common e2fsprogs fdisk
               rsync openssh-client)
export TESTBED_BOX=local
export TESTBED_VM_CPUS="${TESTBED_VM_CPUS:-$(nproc)}"
export TESTBED_VM_MEMORY_MB="${TESTBED_VM_MEMORY_MB:-6144}"
export TESTBED_VM_SSH_PORT="${TESTBED_VM_SSH_PORT:-2722}"
export VAGRANT_NO_COLOR=1
BOX_VOLUME_PREFIX="testbed-VAGRANTSLASH-debian12-netem_vagrant_box_image_"

mkdir -p "$OUT"
rm -rf "$OUT/crosscheck-netem" "$OUT/crosscheck-userspace"
steps="$OUT/steps.tsv"
printf 'step\tseconds\tresult\n' > "$steps"
failed=""
started_daemons=()

# step NAME COMMAND...: run it, log to OUT/NAME.log, time it.
step() {
  local name="$1"; shift
  local t0 rc
  t0=$(date +%s.%N)
  echo "selftest: $name ..." >&2
  "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  local dt; dt=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")
  if [ "$rc" -eq 0 ]; then
    printf '%s\t%s\tok\n' "$name" "$dt" >> "$steps"
    echo "selftest: $name ok ($dt s)" >&2
  else
    printf '%s\t%s\tfailed (exit %s)\n' "$name" "$dt" "$rc" >> "$steps"
    echo "selftest: $name FAILED (exit $rc, $dt s); last lines of $OUT/$name.log:" >&2
    tail -15 "$OUT/$name.log" | sed 's/^/  /' >&2
    failed="${failed:+$failed, }$name"
  fi
  return "$rc"
}
# Vagrant draws progress bars with carriage returns: keep the log readable.
vagrant_q() { (cd "$here" && vagrant "$@") 2>&1 | tr '\r' '\n' | grep -v 'Progress: '; return "${PIPESTATUS[0]}"; }

host_packages() {
  local missing=() p
  for p in "${HOST_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && { echo "all present: ${HOST_PACKAGES[*]}"; return 0; }
  echo "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
host_venv() { [ -x .venv/bin/testbed ] && { echo ".venv present"; return 0; }; ./setup.sh; }

libvirt_up() {
  if ! virsh -c qemu:///system version >/dev/null 2>&1; then
    if [ "$(ps -p 1 -o comm=)" = systemd ]; then
      systemctl start libvirtd
    else
      # No systemd (a container): the daemons by hand; stopped at the end.
      pgrep -x virtlogd >/dev/null || { virtlogd -d && started_daemons+=(virtlogd); }
      libvirtd -d && started_daemons+=(libvirtd)
    fi
    for _ in $(seq 50); do virsh -c qemu:///system version >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  virsh -c qemu:///system version || return 1
  if ! virsh pool-info default >/dev/null 2>&1; then
    virsh pool-define-as default dir --target /var/lib/libvirt/images && virsh pool-build default || return 1
  fi
  # Not `virsh ... | grep -q`: grep leaves early, virsh gets SIGPIPE and
  # pipefail turns the pipeline into a failure. A restarted libvirtd may
  # also be re-activating the pool as we look.
  pool_running || virsh pool-start default || pool_running
}
pool_running() { local info; info=$(virsh pool-info default 2>/dev/null); [[ "$info" =~ State:\ +running ]]; }
stop_daemons() {
  local d pid
  for d in "${started_daemons[@]}"; do
    pid=$(cat "/run/$d.pid" 2>/dev/null) && kill "$pid" 2>/dev/null && echo "selftest: stopped $d (pid $pid)" >&2
  done
  started_daemons=()
}

accel_probe() {
  if [ -n "${TESTBED_VM_ACCEL:-}" ]; then echo "TESTBED_VM_ACCEL=$TESTBED_VM_ACCEL (given)"; return 0; fi
  export TESTBED_VM_ACCEL=tcg
  if [ ! -r /dev/kvm ] || [ ! -w /dev/kvm ]; then echo "no usable /dev/kvm: tcg"; return 0; fi
  local kernel; kernel=$(ls "$repo"/.cache/vagrant/box/vmlinuz-* 2>/dev/null | head -1)
  if [ -z "$kernel" ]; then echo "no guest kernel cached yet: tcg"; return 0; fi
  # A guest boots under KVM, with the CPU the Vagrantfile then asks for
  # (host-passthrough), if its kernel prints its banner within 30 s.
  local log="$OUT/accel-qemu.log" pid i
  qemu-system-x86_64 -accel kvm -machine q35 -cpu host -m 256 -nographic -no-reboot -nic none \
    -kernel "$kernel" -append 'console=ttyS0 panic=-1' </dev/null > "$log" 2>&1 &
  pid=$!
  for i in $(seq 60); do
    grep -q 'Linux version' "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  if grep -q 'Linux version' "$log"; then
    TESTBED_VM_ACCEL=kvm; echo "a guest kernel booted under KVM: kvm"
  else
    echo "qemu under KVM said: $(tr -d '\r' < "$log" | grep -v '^$' | tail -2 | tr '\n' ' ')"
    echo "a guest kernel did not boot under KVM within 30 s: tcg"
  fi
}

port_free() { [ -z "$(ss -ltnH "sport = :$TESTBED_VM_SSH_PORT")" ]; }

# What exists before the VM: the leftover check compares against it.
snapshot() {
  {
    echo "## domains"; virsh list --all --name | sed '/^$/d' | sort
    # the box's uploaded copy is kept on purpose (the next run reuses it)
    echo "## volumes"; virsh vol-list default 2>/dev/null | awk 'NR > 2 && NF {print $1}' \
      | grep -v "^${BOX_VOLUME_PREFIX}" | sort
    echo "## networks"; virsh net-list --all --name | sed '/^$/d' | sort
    echo "## interfaces"; ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
    echo "## qemu processes"; pgrep -x qemu-system-x86 | sort
    echo "## listeners on $TESTBED_VM_SSH_PORT"; ss -ltnH "sport = :$TESTBED_VM_SSH_PORT"
  } 2>/dev/null
}
# Left behind: what exists after destroy and did not before (in its section).
# What went away meanwhile (another program's interfaces, say) is not ours.
leftovers() {
  snapshot > "$OUT/after.txt"
  local left
  left=$(awk 'FNR == 1 { file++ } /^## / { sec = $0; next }
              file == 1 { seen[sec SUBSEP $0] = 1; next }
              !((sec SUBSEP $0) in seen) { print sec ": " $0 }' "$OUT/before.txt" "$OUT/after.txt")
  if [ -z "$left" ]; then
    echo "nothing left: no domain, volume, network, interface, qemu process or listener that was not there before"
  else
    echo "left behind:"; echo "$left"; return 1
  fi
}

domain_name() {
  local id; id=$(cat "$here/.vagrant/machines/default/libvirt/id" 2>/dev/null) || return 1
  virsh domname "$id" 2>/dev/null | sed '/^$/d'
}
destroy() {
  vagrant_q destroy -f
  local rc=$? name
  # If vagrant could not (a half-made domain), remove it by its exact name.
  if name=$(domain_name) && [ -n "$name" ]; then
    virsh destroy "$name" 2>/dev/null; virsh undefine "$name" --remove-all-storage
    rm -rf "$here/.vagrant/machines/default/libvirt"
  fi
  return "$rc"
}

interrupted() {
  trap '' INT TERM
  echo "selftest: interrupted: destroying the VM" >&2
  destroy > "$OUT/destroy-interrupted.log" 2>&1
  stop_daemons
  exit 130
}
trap interrupted INT TERM

guest_check() {
  vagrant_q ssh -c 'cd /testbed && sudo .venv/bin/testbed check' || return 1
}
guest_run() {
  # Under software emulation the guest's own stack adds 2-4 ms to a round
  # trip (docs/backends.md): the preflight ping gets the qemu guest's
  # tolerance, 10 ms, as in `python -m testbed.vm scenario`.
  local tol=3
  [ "$TESTBED_VM_ACCEL" = tcg ] && tol=10
  "$here/run-scenario.sh" "$SCENARIO" "$OUT/crosscheck-netem" -- --backend netem \
    --ready-timeout-s 900 --preflight-tol-ms "$tol"
}
host_run() {
  .venv/bin/testbed run "$SCENARIO" --out "$OUT/crosscheck-userspace" --backend userspace
}
compare() {
  .venv/bin/testbed compare "$OUT/crosscheck-netem" "$OUT/crosscheck-userspace" \
    --labels "guest netem" "host userspace" > "$OUT/compare.md" && cat "$OUT/compare.md"
}

# The body is one function, called on the last line together with exit:
# bash reads a script as it runs, and this way an edit to this file cannot
# break a run under way.
main() {
  t_start=$(date +%s)
  step host-packages host_packages || { stop_daemons; exit 1; }
  step host-venv host_venv || exit 1
  step libvirt libvirt_up || { stop_daemons; exit 1; }
  step box "$here/build-box.sh" || { stop_daemons; exit 1; }
  step accel accel_probe
  port_free || { echo "selftest: 127.0.0.1:$TESTBED_VM_SSH_PORT is in use: set TESTBED_VM_SSH_PORT" >&2; stop_daemons; exit 2; }
  snapshot > "$OUT/before.txt"

  if step up vagrant_q up --provider libvirt --no-provision \
     && step provision vagrant_q provision \
     && step guest-check guest_check; then
    step guest-run guest_run
  fi
  step destroy destroy
  step host-run host_run
  [ -d "$OUT/crosscheck-netem" ] && step compare compare
  step leftovers leftovers
  stop_daemons

  check_line=$(grep -E '^backend ' "$OUT/guest-check.log" 2>/dev/null | head -1)
  grep -Eq '^backend +netem$' <<<"$check_line" || failed="${failed:+$failed, }guest backend is not netem"
  {
    echo "# Vagrant self-test"
    echo
    dirty=""; [ -n "$(git status --porcelain -- testbed vagrant scenarios setup.sh 2>/dev/null)" ] \
      && dirty=" with uncommitted changes"
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$dirty,"
    echo "host $(nproc) cores, accel ${TESTBED_VM_ACCEL}, guest ${TESTBED_VM_CPUS} vCPU / ${TESTBED_VM_MEMORY_MB} MB,"
    echo "total $(( $(date +%s) - t_start )) s. Command: sudo vagrant/selftest.sh $OUT"
    echo
    echo "| step | seconds | result |"; echo "|---|---|---|"
    tail -n +2 "$steps" | awk -F'\t' '{printf "| %s | %s | %s |\n", $1, $2, $3}'
    echo
    echo "Guest \`testbed check\`: \`${check_line:-none}\`"
    echo
    [ -f "$OUT/compare.md" ] && { echo "## $SCENARIO: netem in the guest vs userspace here"; echo; cat "$OUT/compare.md"; echo; }
    .venv/bin/python -m testbed.vm.selftest_summary --accel "$TESTBED_VM_ACCEL" \
      "guest netem=$OUT/crosscheck-netem" "host userspace=$OUT/crosscheck-userspace" 2>&1
    echo
    echo "## Leftovers"; echo; echo '```'; cat "$OUT/leftovers.log" 2>/dev/null; echo '```'
    echo
    if [ -n "$failed" ]; then echo "Verdict: FAILED ($failed)"; else echo "Verdict: passed"; fi
  } > "$OUT/selftest.md"
  echo "selftest: $OUT/selftest.md" >&2
  [ -z "$failed" ]
}
main "$@"; exit $?
