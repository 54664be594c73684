"""The WAN capture hook without root: where it runs, how it is bounded, how it stops."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from testbed.errors import EmulationError
from testbed.scenario import capture as cap


class FakeNet:
    """The EmulatedNetwork surface WanCapture uses; popen runs a real local process."""

    def __init__(self):
        self.channels = {"wan/a>b": SimpleNamespace(node="gwa", dev="gwa-eth1")}
        self.started, self.events = [], SimpleNamespace(log=[])
        self.events.record = lambda kind, **kw: self.events.log.append((kind, kw))

    def popen(self, node, argv, what, **kw):
        self.started.append((node, argv, what))
        # stands in for tcpdump: exits on SIGINT like tcpdump does after flushing
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                start_new_session=True)


def test_capture_runs_on_the_wan_channels_device_bounded_and_stops_on_exit(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(cap.shutil, "which", lambda name: "/usr/bin/" + name)
    net = FakeNet()
    with cap.WanCapture(net, tmp_path / "wan.pcap") as c:
        node, argv, _ = net.started[0]
        assert node == "gwa" and argv[:3] == ["tcpdump", "-i", "gwa-eth1"]
        assert argv[argv.index("-s") + 1] == str(cap.SNAP_BYTES)
        assert argv[argv.index("-c") + 1] == str(cap.MAX_PACKETS)
        assert argv[-2:] == ["-w", str(tmp_path / "wan.pcap")]
        assert c.proc.poll() is None
    assert c.proc.poll() is not None  # stopped (SIGINT) when the block ends
    assert [k for k, _ in net.events.log] == ["capture_start", "capture_end"]


def test_capture_without_tcpdump_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(cap.shutil, "which", lambda name: None)
    with pytest.raises(EmulationError, match="tcpdump"):
        cap.WanCapture(FakeNet(), tmp_path / "wan.pcap")
