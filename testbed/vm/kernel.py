"""The guest kernel: a stock Debian 12 kernel package, unpacked into the cache.

Owns ``.cache/vm/`` (git-ignored) up to the kernel: the downloaded package,
its unpacked tree (``dpkg-deb -x``; nothing is installed into /boot or
/lib/modules of the host) with a ``modules.dep`` made by ``depmod -b``
inside that tree, and ``vmlinux``, the uncompressed ELF cut out of the
xz-compressed vmlinuz (booting it skips ~6 s of decompression under
software emulation; the kernel has CONFIG_PVH, so qemu boots the ELF).

Layout (every step writes into ``tmp/`` and renames, so a killed run leaves
no half-made file under a final name)::

    .cache/vm/debs/linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb
    .cache/vm/kernel/6.1.0-57-amd64/{boot,lib/modules/...,vmlinux,READY}
    .cache/vm/kernel/CURRENT           # the version used without asking apt

Lifecycle: ``ensure_kernel()`` asks apt (``apt-cache depends
linux-image-amd64``) for the package name only when no kernel is cached or
``refresh`` is set; a second call downloads and unpacks nothing.

Example::

    k = ensure_kernel(Path(".cache/vm"))
    k.vmlinux, k.version, k.module_path("sch_netem")
"""

from __future__ import annotations

import lzma
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from testbed.vm.errors import VmError

META_PACKAGE = "linux-image-amd64"  # Debian 12: depends on the current 6.1 kernel
PACKAGE_RE = re.compile(r"^linux-image-(6\.1\.0-\d+-amd64)$")
XZ_MAGIC = b"\xfd7zXZ\x00"
ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class GuestKernel:
    version: str        # e.g. "6.1.0-57-amd64" (uname -r in the guest)
    tree: Path          # the unpacked package
    vmlinux: Path

    @property
    def modules_dir(self) -> Path:
        return self.tree / "lib" / "modules" / self.version

    def module_path(self, name: str) -> Path:
        """The .ko file of module ``name`` (as modules.dep lists it)."""
        rel = self.modules_dep().get(_canon(name))
        if rel is None:
            raise VmError(f"kernel {self.version} has no module {name}")
        return self.modules_dir / rel[0]

    def modules_dep(self) -> dict[str, list[str]]:
        """module name -> [its .ko path, then the .ko paths it depends on]."""
        deps = {}
        for line in (self.modules_dir / "modules.dep").read_text().splitlines():
            ko, _, rest = line.partition(":")
            deps[_canon(Path(ko).name.split(".ko")[0])] = [ko] + rest.split()
        return deps

    def builtin(self) -> set[str]:
        path = self.modules_dir / "modules.builtin"
        return {_canon(Path(p).name.split(".ko")[0]) for p in path.read_text().split()}

    def load_order(self, wanted: tuple[str, ...]) -> list[Path]:
        """.ko files to insmod, dependencies first, for modules ``wanted``
        (built-in ones are skipped)."""
        deps, builtin = self.modules_dep(), self.builtin()
        order: list[str] = []

        def visit(name: str) -> None:
            if name in order or name in builtin:
                return
            if name not in deps:
                raise VmError(f"kernel {self.version} has no module {name}")
            for dep_path in reversed(deps[name][1:]):  # modules.dep: deepest dep last
                visit(_canon(Path(dep_path).name.split(".ko")[0]))
            order.append(name)

        for name in wanted:
            visit(_canon(name))
        return [self.modules_dir / deps[n][0] for n in order]


def _canon(name: str) -> str:
    return name.replace("-", "_")


def _run(args: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        r = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=900)
    except FileNotFoundError:
        raise VmError(f"{what}: {args[0]} not found (a Debian/Ubuntu host is needed)") from None
    if r.returncode != 0:
        raise VmError(f"{what}: {' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-800:]}")
    return r.stdout


def resolve_package() -> str:
    """The current Debian 12 kernel package, e.g. linux-image-6.1.0-57-amd64.

    The meta package's dependency names it; failing that, the highest ABI
    number apt knows of.
    """
    out = subprocess.run(["apt-cache", "depends", META_PACKAGE], capture_output=True,
                         text=True).stdout
    for word in re.findall(r"Depends:\s*(\S+)", out):
        if PACKAGE_RE.match(word):
            return word
    out = _run(["apt-cache", "search", "--names-only", r"^linux-image-6\.1\.0-[0-9]+-amd64$"],
               "find the kernel package")
    names = [line.split()[0] for line in out.splitlines() if PACKAGE_RE.match(line.split()[0])]
    if not names:
        raise VmError("apt knows no linux-image-6.1.0-*-amd64 package: this needs Debian 12's "
                      "archive in apt's sources (and 'apt-get update' run once)")
    return max(names, key=lambda n: int(n.split("-")[3]))


def extract_vmlinux(vmlinuz: Path, out: Path) -> None:
    """Cut the xz stream out of a bzImage and write the ELF it holds."""
    data = vmlinuz.read_bytes()
    at = data.find(XZ_MAGIC)
    if at < 0:
        raise VmError(f"{vmlinuz}: no xz stream (not a Debian x86 kernel?)")
    elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[at:])
    if not elf.startswith(ELF_MAGIC):
        raise VmError(f"{vmlinuz}: the xz stream at {at} is not an ELF kernel")
    tmp = out.with_suffix(".part")
    tmp.write_bytes(elf)
    tmp.rename(out)


def _download(package: str, debs: Path, tmp_root: Path) -> Path:
    found = sorted(debs.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    debs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
        _run(["apt-get", "download", "-q", package], f"download {package}", cwd=Path(tmp))
        [deb] = Path(tmp).glob("*.deb")
        return Path(shutil.move(str(deb), debs / deb.name))


def _unpack(deb: Path, version: str, dest: Path, tmp_root: Path) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
        tree = Path(tmp) / "tree"
        _run(["dpkg-deb", "-x", str(deb), str(tree)], f"unpack {deb.name}")
        mods = tree / "lib" / "modules" / version
        if not mods.is_dir():
            raise VmError(f"{deb.name} holds no lib/modules/{version}")
        _run(["depmod", "-b", str(tree), version], "depmod (inside the unpacked tree)")
        [vmlinuz] = (tree / "boot").glob("vmlinuz-*")
        extract_vmlinux(vmlinuz, tree / "vmlinux")
        (tree / "READY").write_text(deb.name + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tree.rename(dest)


def cached_kernel(cache: Path) -> GuestKernel | None:
    current = cache / "kernel" / "CURRENT"
    if not current.is_file():
        return None
    version = current.read_text().strip()
    tree = cache / "kernel" / version
    if not (tree / "READY").is_file():
        return None
    return GuestKernel(version, tree, tree / "vmlinux")


def ensure_kernel(cache: Path, refresh: bool = False) -> GuestKernel:
    """The cached guest kernel; download and unpack it first if needed.

    Call with the cache lock held (testbed.vm.cache.locked)."""
    if not refresh:
        kernel = cached_kernel(cache)
        if kernel is not None:
            return kernel
    package = resolve_package()
    version = PACKAGE_RE.match(package).group(1)
    tmp_root = cache / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    tree = cache / "kernel" / version
    if not (tree / "READY").is_file():
        deb = _download(package, cache / "debs", tmp_root)
        tree.parent.mkdir(parents=True, exist_ok=True)
        _unpack(deb, version, tree, tmp_root)
    (cache / "kernel" / "CURRENT").write_text(version + "\n")
    return GuestKernel(version, tree, tree / "vmlinux")
