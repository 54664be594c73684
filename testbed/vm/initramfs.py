"""The guest's initramfs: busybox, the 9p/overlay modules and a two-stage init.

Owns ``.cache/vm/initramfs-{kernel}-{hash}.cpio.gz`` (newc cpio, gzip),
rebuilt only when its inputs change (the hash covers the init scripts, the
module list, the kernel version and busybox itself).

Stage one (``/init``, PID 1 in the initramfs):
  mount proc/sys/devtmpfs; insmod the virtio/9p/overlay modules in
  modules.dep order; wait for the 9p devices; mount the host root read-only
  over 9p and put an overlay on it whose upper dir is a tmpfs (every write
  stays in guest RAM); a fresh tmpfs on /run (hides the host's /run, e.g.
  its /run/testbed state files); the host's unpacked kernel modules bound
  on /lib/modules/$(uname -r) so the kernel's module auto-load (modprobe
  from the host root) finds sch_netem, veth, ...; the writable results
  share mounted at the same path as on the host; proc/sys/dev moved in;
  ``exec switch_root`` (PID 1 must switch itself, or module auto-load does
  not see the new root).
Stage two (``/run/vm/stage2``, busybox sh, PID 1 in the new root):
  devpts, /dev/shm, lo up; run ``$results/run.sh`` with a clean
  environment, stdout/stderr into ``$results/stdout``/``stderr``; write
  ``$results/exit_code``; print the marker line; sync; ``poweroff -f``.

The kernel command line passes ``tbvm_results``, ``tbvm_modules`` (words
with ``=`` and no dot before it reach /init as environment variables), so
those paths must not contain blanks or quotes (checked by the caller).
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import stat
from pathlib import Path

from testbed.vm.errors import VmError
from testbed.vm.kernel import GuestKernel

# Modules the initramfs loads itself (their dependencies come along).
INITRAMFS_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
HOST_TAG, RESULTS_TAG = "hostroot", "results"
EXIT_MARKER = "TESTBED-VM-EXIT"
FAIL_MARKER = "TESTBED-VM-FAIL"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "@FAIL@ $*"; sync; poweroff -f; sleep 5; }
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs dev /dev \
  || fail "mount proc/sys/dev"
for ko in @MODULES@; do insmod "/modules/$ko" || fail "insmod $ko"; done
n=0  # sysfs mount_tag holds the tag and a NUL, no newline
until cat /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag 2>/dev/null | tr '\0' '\n' \
      | grep -c -e "^@HOST@$" -e "^@RESULTS@$" | grep -q 2; do
  n=$((n + 1)); [ "$n" -gt 400 ] && fail "no 9p devices after 400 tries"; sleep 0.02
done
opts=trans=virtio,version=9p2000.L,msize=262144
mkdir -p /lower /upper /newroot
mount -t 9p -o "$opts,ro,cache=loose" @HOST@ /lower || fail "mount host root (9p)"
mount -t tmpfs -o mode=0755 upper /upper && mkdir -p /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /newroot \
  || fail "overlay on the host root"
mount -t tmpfs -o mode=0755,nosuid,nodev run /newroot/run || fail "tmpfs /run"
mkdir -p /newroot/run/vm && cp /bin/busybox /stage2 /newroot/run/vm/
kver=$(uname -r)
mkdir -p "/newroot/lib/modules/$kver"
mount --bind "/newroot$tbvm_modules" "/newroot/lib/modules/$kver" || fail "bind modules"
[ -d "/newroot$tbvm_results" ] || fail "no results folder $tbvm_results in the guest"
mount -t 9p -o "$opts,cache=none" @RESULTS@ "/newroot$tbvm_results" || fail "mount results"
for d in proc sys dev; do mount --move "/$d" "/newroot/$d" || fail "move /$d"; done
exec switch_root /newroot /run/vm/busybox sh /run/vm/stage2
"""

STAGE2 = r"""B=/run/vm/busybox
$B mkdir -p /dev/pts /dev/shm
$B mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
$B mount -t tmpfs -o mode=1777,nosuid,nodev shm /dev/shm
$B hostname testbed-vm
$B ip link set lo up
R="$tbvm_results"
$B cat /proc/uptime >"$R/guest_uptime"
$B env -i PATH=@PATH@ HOME=/root LANG=C.UTF-8 TERM=dumb PYTHONDONTWRITEBYTECODE=1 \
  /bin/sh "$R/run.sh" >"$R/stdout" 2>"$R/stderr" </dev/null
rc=$?
echo "$rc" >"$R/exit_code.part" && $B mv "$R/exit_code.part" "$R/exit_code"
$B sync
echo "@EXIT@ $rc"
$B poweroff -f
"""


def init_scripts(modules: list[Path]) -> tuple[str, str]:
    init = (INIT.replace("@MODULES@", " ".join(p.name for p in modules))
            .replace("@HOST@", HOST_TAG).replace("@RESULTS@", RESULTS_TAG)
            .replace("@FAIL@", FAIL_MARKER))
    stage2 = STAGE2.replace("@PATH@", GUEST_PATH).replace("@EXIT@", EXIT_MARKER)
    return init, stage2


def find_busybox() -> Path:
    """A statically linked busybox (Debian's busybox-static)."""
    for cand in BUSYBOX_CANDIDATES:
        p = Path(cand)
        if p.is_file() and b"\x00/lib64/ld-linux" not in p.read_bytes()[:4096]:
            return p
    raise VmError("no static busybox: apt-get install busybox-static")


class Cpio:
    """A newc ("070701") cpio archive built in memory, in order."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._ino = 0

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple = (0, 0)) -> None:
        self._ino += 1
        nb = name.encode() + b"\0"
        fields = (self._ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(nb), 0)
        head = b"070701" + b"".join(b"%08X" % f for f in fields) + nb
        self._parts += [head, b"\0" * (-len(head) % 4), data, b"\0" * (-len(data) % 4)]

    def dir(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def chardev(self, name: str, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return b"".join(self._parts)


def build_archive(kernel: GuestKernel, busybox: Path) -> bytes:
    modules = kernel.load_order(INITRAMFS_MODULES)
    init, stage2 = init_scripts(modules)
    c = Cpio()
    for d in ("bin", "dev", "proc", "sys", "modules", "lower", "upper", "newroot"):
        c.dir(d)
    c.chardev("dev/console", 5, 1)  # the kernel opens it for init's stdio
    c.file("bin/busybox", busybox.read_bytes(), 0o755)
    c.file("init", init.encode(), 0o755)
    c.file("stage2", stage2.encode(), 0o755)
    for ko in modules:
        c.file(f"modules/{ko.name}", ko.read_bytes())
    return gzip.compress(c.finish(), compresslevel=6, mtime=0)


def inputs_hash(kernel: GuestKernel, busybox: Path) -> str:
    modules = kernel.load_order(INITRAMFS_MODULES)
    h = hashlib.sha256()
    for part in init_scripts(modules) + (kernel.version,):
        h.update(part.encode())
    h.update(busybox.read_bytes())
    return h.hexdigest()[:12]


def ensure_initramfs(cache: Path, kernel: GuestKernel) -> Path:
    """The cached initramfs for ``kernel``; built first if its inputs changed.

    Call with the cache lock held."""
    busybox = find_busybox()
    out = cache / f"initramfs-{kernel.version}-{inputs_hash(kernel, busybox)}.cpio.gz"
    if out.is_file():
        return out
    for old in cache.glob(f"initramfs-{kernel.version}-*.cpio.gz"):
        old.unlink()
    tmp = cache / "tmp" / (out.name + ".part")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(build_archive(kernel, busybox))
    shutil.move(str(tmp), out)
    return out
