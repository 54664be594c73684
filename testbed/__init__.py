"""PDD network emulation testbed: two emulated datacenters, shaped WAN, PDD roles."""

__version__ = "0.1.0"
