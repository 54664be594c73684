#!/usr/bin/env bash
# Build the Vagrant box "testbed/debian12-netem" for the libvirt provider from
# Debian packages alone (no box download), and add it to Vagrant.
#
#   sudo vagrant/build-box.sh [--force]
#
# The box: Debian 12 (bookworm) made by mmdebstrap, Debian's stock kernel
# (linux-image-amd64: sch_netem, ifb, sch_htb are modules of it), systemd,
# openssh-server, the qemu guest agent, a "vagrant" user with sudo and
# Vagrant's well-known insecure key (Vagrant swaps it for a new key on the
# first `vagrant up`), every Debian package setup.sh installs, and the
# wheels of this project's Python dependencies in /opt/wheels (pip's
# find-links in /etc/pip.conf, so setup.sh inside installs the CPU build
# of torch and needs little from the network). One MBR partition, ext4,
# booted by extlinux; the image is qcow2.
#
# Cached and idempotent: .cache/vagrant/box/ holds the image and a stamp of
# its inputs (this script, setup.sh's package list, the wheel list); a run
# whose stamp matches and whose box Vagrant already has builds nothing.
# --force rebuilds. Needs root (mmdebstrap's chroot, a loop mount for
# extlinux) and the packages named in NEEDS below; vagrant/selftest.sh
# installs them. Exit 0 built or reused, 1 a step failed, 2 usage.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
BOX_NAME="testbed/debian12-netem"
SUITE=bookworm
MIRROR="http://deb.debian.org/debian"
DISK_GB=16
NEEDS=(mmdebstrap extlinux syslinux-common qemu-utils e2fsprogs fdisk)
cache="$repo/.cache/vagrant/box"
force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "build-box: unknown argument $1" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "build-box: run as root" >&2; exit 2; }
for p in "${NEEDS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || { echo "build-box: package $p is missing (apt-get install ${NEEDS[*]})" >&2; exit 2; }
done
command -v vagrant >/dev/null || { echo "build-box: vagrant is not installed" >&2; exit 2; }
[ -x "$repo/.venv/bin/pip" ] || { echo "build-box: run setup.sh first (the wheels come from .venv's packages)" >&2; exit 2; }

# setup.sh's Debian packages: one list, read from setup.sh itself.
eval "$(sed -n '/^APT_PACKAGES=(/,/)/p' "$repo/setup.sh")"
BOX_PACKAGES=(linux-image-amd64 initramfs-tools systemd-sysv udev dbus openssh-server sudo rsync
              qemu-guest-agent ca-certificates python3 python3-venv python3-pip-whl
              python3-setuptools-whl iproute2 kmod "${APT_PACKAGES[@]}")

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -n 9 || { echo "build-box: another build holds $cache/.lock" >&2; exit 1; }

# The wheels: what .venv has (less the project itself), as pip would take them.
reqs="$cache/requirements.txt"
"$repo/.venv/bin/pip" freeze --exclude-editable | grep -v '^-e ' | sort > "$reqs.new"
mv "$reqs.new" "$reqs"
stamp=$( { cat "$0"; printf '%s\n' "${BOX_PACKAGES[@]}"; cat "$reqs"; } | sha256sum | cut -c1-16)
box="$cache/testbed-debian12-netem.box"
if [ "$force" = 0 ] && [ -f "$box" ] && [ "$(cat "$cache/STAMP" 2>/dev/null)" = "$stamp" ] \
   && vagrant box list --machine-readable 2>/dev/null | grep -q ",box-name,$BOX_NAME\$"; then
  echo "build-box: $BOX_NAME is current (stamp $stamp, $(du -h "$box" | cut -f1)); nothing to build"
  exit 0
fi

t0=$(date +%s)
work="$cache/work"
mnt="$work/mnt"
cleanup() {
  mountpoint -q "$mnt" 2>/dev/null && umount "$mnt"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$work"
mkdir -p "$work/wheels" "$mnt"

echo "build-box: wheels for $(wc -l < "$reqs") requirements"
"$repo/.venv/bin/pip" download -q -d "$work/wheels" -r "$reqs" pip setuptools wheel \
  > "$work/pip.log" 2>&1 || { cat "$work/pip.log" >&2; exit 1; }

echo "build-box: mmdebstrap $SUITE (${#BOX_PACKAGES[@]} packages and their dependencies)"
include=$(IFS=,; echo "${BOX_PACKAGES[*]}")
mmdebstrap --quiet --variant=minbase --include="$include" \
  --customize-hook='echo testbed > "$1/etc/hostname"' \
  "$SUITE" "$work/rootfs" \
  "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
  "deb http://deb.debian.org/debian-security $SUITE-security main"

root="$work/rootfs"
kver=$(ls "$root/lib/modules" | sort -V | tail -1)
[ -f "$root/boot/vmlinuz-$kver" ] && [ -f "$root/boot/initrd.img-$kver" ] \
  || { echo "build-box: no kernel or initrd in the image ($kver)" >&2; exit 1; }
echo "build-box: kernel $kver"
# The guest kernel beside the box, for selftest.sh's KVM probe.
rm -f "$cache"/vmlinuz-*
cp "$root/boot/vmlinuz-$kver" "$cache/vmlinuz-$kver"

# The vagrant user, sudo without password, the insecure key.
chroot "$root" useradd -m -s /bin/bash vagrant
echo 'vagrant ALL=(ALL) NOPASSWD: ALL' > "$root/etc/sudoers.d/vagrant"
chmod 440 "$root/etc/sudoers.d/vagrant"
key=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | head -1)
[ -n "$key" ] || { echo "build-box: Vagrant's insecure public key not found" >&2; exit 1; }
install -d -m 700 -o 1000 -g 1000 "$root/home/vagrant/.ssh"
install -m 600 -o 1000 -g 1000 "$key" "$root/home/vagrant/.ssh/authorized_keys"
printf 'UseDNS no\n' > "$root/etc/ssh/sshd_config.d/vagrant.conf"
# Host keys are made at first boot, not shipped in the box.
rm -f "$root"/etc/ssh/ssh_host_*
mkdir -p "$root/etc/systemd/system/ssh.service.d"
cat > "$root/etc/systemd/system/ssh.service.d/host-keys.conf" <<'EOF'
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
EOF
# Network: the Vagrantfile's placeholder NIC (by MAC) gets a link-local
# address, the guest agent's answer to "which address has the domain";
# every other NIC takes DHCP (qemu's user network, or a libvirt network).
cat > "$root/etc/systemd/network/10-placeholder.network" <<'EOF'
[Match]
MACAddress=52:54:00:7e:57:02
[Network]
Address=169.254.57.2/16
LinkLocalAddressing=no
EOF
cat > "$root/etc/systemd/network/20-dhcp.network" <<'EOF'
[Match]
Name=eth*
[Network]
DHCP=ipv4
EOF
chroot "$root" systemctl enable systemd-networkd >/dev/null 2>&1
# qemu's user-mode network answers DNS at 10.0.2.3; libvirt networks give theirs by DHCP.
echo 'nameserver 10.0.2.3' > "$root/etc/resolv.conf"
echo 'UUID=ROOTUUID / ext4 defaults,noatime 0 1' > "$root/etc/fstab"
# pip finds the CPU build of torch (and the rest) here first.
mkdir -p "$root/opt/wheels"
cp "$work/wheels"/* "$root/opt/wheels/"
printf '[global]\nfind-links = /opt/wheels\n' > "$root/etc/pip.conf"
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*_Packages

# The disk: one partition from 1 MiB, ext4 made from the tree, extlinux, MBR.
raw="$work/disk.raw"
truncate -s "${DISK_GB}G" "$raw"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$raw"
offset=$((2048 * 512))
part_bytes=$(( DISK_GB * 1024 * 1024 * 1024 - offset ))
uuid=$(cat /proc/sys/kernel/random/uuid)
sed -i "s/ROOTUUID/$uuid/" "$root/etc/fstab"
mkdir -p "$root/boot/extlinux"
cat > "$root/boot/extlinux/extlinux.conf" <<EOF
DEFAULT debian
TIMEOUT 0
LABEL debian
  KERNEL /boot/vmlinuz-$kver
  INITRD /boot/initrd.img-$kver
  APPEND root=UUID=$uuid ro console=ttyS0,115200 net.ifnames=0 biosdevname=0 quiet
EOF
mkfs.ext4 -q -F -U "$uuid" -L testbed-root -d "$root" -E "offset=$offset" "$raw" "$((part_bytes / 1024))k"
mount -o loop,offset="$offset" "$raw" "$mnt"
extlinux --install "$mnt/boot/extlinux" 2>/dev/null
umount "$mnt"
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$raw" bs=440 count=1 conv=notrunc status=none

echo "build-box: qcow2 and box"
qemu-img convert -O qcow2 "$raw" "$work/box.img"
rm -f "$raw"
printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %d}\n' "$DISK_GB" > "$work/metadata.json"
cat > "$work/Vagrantfile" <<'EOF'
# testbed/debian12-netem: built by vagrant/build-box.sh from Debian packages.
Vagrant.configure("2") do |config|
  config.vm.provider "libvirt" do |lv|
    lv.disk_bus = "virtio"
  end
end
EOF
tar -C "$work" -cf "$box.new" metadata.json Vagrantfile box.img
mv "$box.new" "$box"
vagrant box add --force --name "$BOX_NAME" "$box" >/dev/null
# vagrant-libvirt keeps an uploaded copy of a box in the storage pool, named
# after the box; the copy of a box this build replaced is stale: remove it.
if command -v virsh >/dev/null && virsh pool-info default >/dev/null 2>&1; then
  for vol in $(virsh vol-list default 2>/dev/null | awk 'NR > 2 {print $1}'); do
    case "$vol" in
      "${BOX_NAME//\//-VAGRANTSLASH-}"_vagrant_box_image_*) virsh vol-delete --pool default "$vol" >/dev/null ;;
    esac
  done
fi
echo "$stamp" > "$cache/STAMP"
echo "build-box: added $BOX_NAME ($(du -h "$box" | cut -f1), kernel $kver) in $(( $(date +%s) - t0 )) s"
