"""A bounded packet capture of the WAN for one mode: ``MODE/wan.pcap``.

Owns the tcpdump hook of a run (``--pcap``; ``testbed reproduce`` turns it
on). The capture runs in the node that holds the ``wan/a>b`` channel's
shaper, on that channel's device: packets leave the shaper there (a>b) and
arrive from the far side (b>a), so the file holds both directions of every
WAN flow, the PDD roles' and the cross traffic's, after shaping. Bounded in
every way: a snap length of SNAP_BYTES (headers, and a PDD frame header at a
segment's start; ``testbed.report.pcap`` counts bytes from the IP header's
length, so the cut loses no accounting) and at most MAX_PACKETS packets
(about MAX_PACKETS x SNAP_BYTES on disk: ~25 MB), after which tcpdump stops
by itself and the rest of the mode is not captured (the analysis says how
many packets it saw; links.csv still counts everything). Started after the
preflight ping, stopped (SIGINT: tcpdump flushes and closes the file) when
the workload ends; registered with the network's registry like every
process, so a killed run's tcpdump is stopped by ``testbed clean``.

Example::

    with WanCapture(net, mode_dir / "wan.pcap"):
        ...  # the workload
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

from testbed.errors import EmulationError
from testbed.net.registry import stop_process

SNAP_BYTES = 128
MAX_PACKETS = 200_000
WAN_CHANNEL = "wan/a>b"


def capture_argv(dev: str, path: Path, snap: int = SNAP_BYTES,
                 max_packets: int = MAX_PACKETS) -> list[str]:
    """tcpdump's command line: no name resolution, packet-buffered writes, keeps root (the
    run folder is root's), bounded."""
    return ["tcpdump", "-i", dev, "-n", "-U", "-Z", "root", "-s", str(snap),
            "-c", str(max_packets), "-w", str(path)]


class WanCapture:
    """tcpdump on the WAN channel's device while the ``with`` block runs."""

    def __init__(self, net, path: Path, snap: int = SNAP_BYTES,
                 max_packets: int = MAX_PACKETS):
        if shutil.which("tcpdump") is None:
            raise EmulationError("--pcap needs tcpdump (apt-get install tcpdump; setup.sh "
                                 "installs it)")
        ch = net.channels[WAN_CHANNEL]
        self.net, self.path = net, Path(path)
        self.node, self.dev = ch.node, ch.dev
        self.argv = capture_argv(ch.dev, self.path, snap, max_packets)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "WanCapture":
        self.proc = self.net.popen(self.node, self.argv, what=f"tcpdump {self.dev}",
                                   stderr=subprocess.DEVNULL)
        self.net.events.record("capture_start", node=self.node, dev=self.dev,
                               path=self.path.name, argv=self.argv)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            stop_process(self.proc.pid, None, timeout_s=5.0, first=signal.SIGINT)
            self.net.events.record("capture_end", exit=self.proc.poll(),
                                   bytes=self.path.stat().st_size if self.path.exists() else 0)
