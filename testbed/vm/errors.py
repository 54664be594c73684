"""Errors of the VM harness (part of the testbed's one hierarchy)."""

from __future__ import annotations

from testbed.errors import TestbedError


class VmError(TestbedError):
    """The guest could not be prepared, booted, or did not report back."""


class VmTimeout(VmError):
    """The guest did not power off within its time limit (qemu was killed)."""
