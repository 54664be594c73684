"""VM test harness: run commands in a qemu guest whose kernel has sch_netem.

The host this project's CI runs on has no sch_netem (and cannot load
modules), so the netem backend is exercised for real inside a throwaway
guest: a stock Debian 12 kernel booted by qemu under software emulation,
with the host's root shared read-only. See guest.py (lifecycle), kernel.py
and initramfs.py (the cached boot files), netem_check.py (the backend's
accuracy in the guest) and ``python -m testbed.vm --help``.
"""

from testbed.vm.errors import VmError, VmTimeout
from testbed.vm.guest import GuestResult, VmConfig, prepare, run_in_guest

__all__ = ["GuestResult", "VmConfig", "VmError", "VmTimeout", "prepare", "run_in_guest"]
