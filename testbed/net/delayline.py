"""Userspace delay line: one direction of an emulated WAN link, for kernels without netem.

This module owns the delay line *process* and its control protocol; the
per-frame decisions (delay, jitter, loss, reorder, duplication, limit, link down) live in
``testbed.net.impairments`` and are pure.

Process lifecycle (one process per link direction, inside the WAN node's
network namespace)::

    python -m testbed.net.delayline --in IF_IN --out IF_OUT --control SOCK_PATH \
        [--params JSON]

1. Open an AF_PACKET socket on IF_IN (ETH_P_ALL, PACKET_VNET_HDR so 64 KB GSO
   frames pass, promiscuous, PACKET_IGNORE_OUTGOING so it never re-reads what
   a delay line wrote) and one on IF_OUT for sending (PACKET_VNET_HDR, no
   receive). Bind the control socket (UNIX datagram) at SOCK_PATH; refuse to
   start if that path exists. Print ``ready`` (flushed) on stdout.
2. Loop: wait for input or the next release time (poll for whole
   milliseconds, which input interrupts; then one exact sleep for the last
   fraction), read every frame that arrived, answer control messages, write
   every frame whose release time has come to IF_OUT with the vnet header it
   arrived with. A frame's arrival time is the kernel's receive timestamp
   (SO_TIMESTAMPNS), not the time it was read: a frame that arrives during
   the last sub-millisecond sleep is timed as exactly as one read at once,
   so the loop does not have to wake every fraction of a millisecond to look
   for input (it did, in 0.2 ms naps: ~5,000 wake-ups a second per direction
   under steady traffic, 12 s of CPU per line in a 60 s fleet run on two
   cores, where the roles compete for the same cores). A timestamp the
   kernel did not give, or one more than ``MAX_STAMP_AGE_S`` old or in the
   future (a clock it does not share), is replaced by the time of reading and
   counted (``unstamped``). A frame the out interface refuses (e.g. htb's
   queue is full: ENOBUFS, or it is down) counts as ``dropped_tx``. Either
   interface may go down and up (a link flap) while the process runs.
   The process runs under SCHED_FIFO when it may (``make_realtime``), so the
   roles' compute sharing its core does not make frames late.
3. SIGTERM/SIGINT: stop the loop, close the sockets, unlink SOCK_PATH, exit 0.
   Frames still held are discarded.

Control protocol (JSON datagrams; every reply carries ``"ok"``):
- ``{"op": "set", "params": {...}}`` replaces all parameters atomically
  (missing fields take their defaults) -> ``{"ok": true}``.
- ``{"op": "stats"}`` -> ``{"ok": true, "frames_in": .., "frames_out": ..,
  "bytes_in": .., "bytes_out": .., "dropped_loss": .., "dropped_limit": ..,
  "dropped_down": .., "dropped_tx": .., "dropped_kernel": .., "duplicated": ..,
  "unstamped": .., "held": ..,
  "lateness": {...}, "realtime": bool}``; ``lateness`` is the histogram (testbed.histogram) of how late each
  sent frame left, its send time minus its scheduled release time.
  Bytes count Ethernet frames without the vnet header. frames_in + duplicated =
  frames_out + dropped_{loss,limit,down,tx} + held; dropped_kernel counts frames the
  kernel dropped before the delay line read them (it is saturated).
- Anything else -> ``{"ok": false, "error": "..."}``; the process carries on.

Example (from the parent, outside the namespace is fine: it is a file path)::

    ctl = DelayLineControl("/run/tb/wan-ab.sock")
    ctl.set(DelayParams(delay_ms=25, jitter_ms=2, seed=1))
    ctl.stats()["frames_out"]
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import secrets
import select
import signal
import socket
import struct
import sys
import time

from testbed.errors import EmulationError, SpecError
from testbed.net.impairments import DelayParams, HoldQueue

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
PACKET_STATISTICS = 6
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
VNET_HDR_LEN = 10  # struct virtio_net_hdr
SOCK_BUF_BYTES = 32 << 20  # absorbs stalls; when it overflows: dropped_kernel
MAX_FRAME = 256 << 10  # > 64 KB GSO frame + headers
READ_BATCH = 64  # frames read before releasing due ones again (bounds added delay)
IDLE_POLL_MS = 100  # how often an idle loop looks at its stop flag
SO_TIMESTAMPNS = 35  # = SCM_TIMESTAMPNS; <asm-generic/socket.h>, absent from Python's socket
_TIMESPEC = struct.Struct("qq")  # struct timespec on a 64-bit kernel
STAMP_CMSG_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)
MAX_STAMP_AGE_S = 1.0  # an older (or future) kernel timestamp is not the arrival's
CONTROL_MAX = 65536
RT_PRIORITY = 10  # SCHED_FIFO priority of a delay line (1-99; above every normal process)


def open_in_socket(ifname: str) -> socket.socket:
    """Packet socket that reads every frame arriving on ifname, with vnet headers."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # receives nothing yet
    try:
        sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, SOCK_BUF_BYTES)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # arrival times: kernel's
        sock.bind((ifname, ETH_P_ALL))
        mreq = struct.pack("iHH8s", socket.if_nametoindex(ifname), PACKET_MR_PROMISC, 0, b"")
        sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def open_out_socket(ifname: str) -> socket.socket:
    """Packet socket that writes frames (vnet header first) to ifname; reads nothing."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, SOCK_BUF_BYTES)
        sock.bind((ifname, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def open_control_socket(path: str) -> socket.socket:
    if os.path.lexists(path):
        raise EmulationError(f"control socket path {path} exists; refusing to replace it")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(path)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def handle_control(queue: HoldQueue, data: bytes) -> dict:
    """Apply one control message to the queue and return the reply (pure)."""
    try:
        msg = json.loads(data)
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "stats":
            return {"ok": True, **queue.stats_dict()}
        if op == "set":
            queue.set_params(DelayParams.from_dict(msg.get("params")))
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {op!r}; expected 'set' or 'stats'"}
    except (ValueError, TypeError, SpecError) as exc:  # JSON errors are ValueErrors
        return {"ok": False, "error": str(exc)}


class StopFlag:
    """Set from a signal handler, tested by the loop."""

    def __init__(self) -> None:
        self._set = False

    def set(self, *_: object) -> None:
        self._set = True

    def __bool__(self) -> bool:
        return self._set


class DelayLine:
    """The forwarding loop of one delay line; owns its three sockets."""

    def __init__(self, if_in: str, if_out: str, control_path: str, params: DelayParams):
        self.queue = HoldQueue(params)
        self._control_path: str | None = None  # set once we own the path
        self._buf = bytearray(MAX_FRAME)
        self._socks: list[socket.socket] = []
        try:
            self._in = self._own(open_in_socket(if_in))
            self._out = self._own(open_out_socket(if_out))
            self._ctl = self._own(open_control_socket(control_path))
            self._control_path = control_path
        except BaseException:
            self.close()
            raise
        self._poller = select.poll()
        self._poller.register(self._in, select.POLLIN)
        self._poller.register(self._ctl, select.POLLIN)

    def _own(self, sock: socket.socket) -> socket.socket:
        self._socks.append(sock)
        return sock

    def close(self) -> None:
        """Close the sockets and unlink the control socket; idempotent."""
        for sock in self._socks:
            sock.close()
        self._socks = []
        if self._control_path is not None:
            try:
                os.unlink(self._control_path)
            except FileNotFoundError:
                pass
            self._control_path = None

    def run(self, stop: StopFlag) -> None:
        """Forward frames until ``stop`` is set (by a signal handler)."""
        while not stop:
            self._wait()
            self._read_frames()
            self._read_control()
            self._release()

    def _wait(self) -> None:
        """Block until input arrives or the next frame is (almost) due."""
        nxt = self.queue.next_release_s()
        if nxt is None:
            self._poller.poll(IDLE_POLL_MS)
            return
        left_s = nxt - time.monotonic()
        if left_s <= 0:
            return
        whole_ms = int(left_s * 1000)
        if whole_ms >= 1:
            self._poller.poll(whole_ms)  # wakes before the deadline, or on input
        else:  # input arriving meanwhile keeps its kernel timestamp (module docstring)
            time.sleep(left_s)

    def _read_frames(self) -> None:
        view = memoryview(self._buf)
        mono_minus_real = time.monotonic() - time.time()  # the kernel stamps CLOCK_REALTIME
        for _ in range(READ_BATCH):
            try:  # n: the frame's real length (MSG_TRUNC)
                n, anc, _, _ = self._in.recvmsg_into([view], STAMP_CMSG_BYTES, socket.MSG_TRUNC)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENETDOWN:  # IF_IN went down (link flap): reported
                    return  # once; the kernel resumes delivery when it comes back up
                raise
            if n > MAX_FRAME:
                raise EmulationError(f"a {n}-byte frame does not fit the {MAX_FRAME}-byte "
                                     f"buffer (BIG TCP on the link?); refusing to corrupt it")
            if n <= VNET_HDR_LEN:
                continue
            read_s = time.monotonic()
            arrived = arrival_s(anc, mono_minus_real, read_s)
            if arrived is None:
                self.queue.stats.unstamped += 1
                arrived = read_s
            self.queue.admit(arrived, bytes(view[:n]), n - VNET_HDR_LEN)

    def _count_kernel_drops(self) -> None:
        """Add the in socket's overflow drops since the last call (reading resets them)."""
        raw = self._in.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        self.queue.stats.dropped_kernel += struct.unpack("II", raw)[1]

    def _read_control(self) -> None:
        while True:
            try:
                data, addr = self._ctl.recvfrom(CONTROL_MAX)
            except BlockingIOError:
                return
            self._count_kernel_drops()
            reply = handle_control(self.queue, data)
            if addr:
                try:
                    self._ctl.sendto(json.dumps(reply).encode(), addr)
                except OSError:
                    pass  # the client gave up and removed its socket

    def _release(self) -> None:
        for frame, size in self.queue.pop_due(time.monotonic()):
            try:
                self._out.send(frame)
            except OSError:  # ENOBUFS (qdisc full), ENETDOWN...
                self.queue.record_tx_error()
            else:
                self.queue.record_sent(size, time.monotonic())


def arrival_s(ancdata: list[tuple[int, int, bytes]], mono_minus_real: float,
              read_s: float) -> float | None:
    """A frame's arrival on the monotonic clock, from the SO_TIMESTAMPNS control message
    of its ``recvmsg``; None without one, or when it lies more than ``MAX_STAMP_AGE_S``
    before ``read_s`` (when the frame was read) or after it (not this frame's arrival).

    >>> stamp = [(socket.SOL_SOCKET, SO_TIMESTAMPNS, _TIMESPEC.pack(100, 250_000_000))]
    >>> arrival_s(stamp, mono_minus_real=-90.0, read_s=10.3)
    10.25
    """
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            arrived = sec + nsec * 1e-9 + mono_minus_real
            if read_s - MAX_STAMP_AGE_S <= arrived <= read_s + 0.001:
                return min(arrived, read_s)
            return None
    return None


class DelayLineControl:
    """Client for a running delay line's control socket.

    Each request binds its own temporary datagram socket next to the control
    socket (so the delay line can answer), and removes it afterwards.

    Example::

        DelayLineControl("/tmp/tb/ab.sock", timeout_s=2).set(DelayParams(delay_ms=10))
    """

    def __init__(self, sock_path: str, timeout_s: float = 2.0):
        self.sock_path = sock_path
        self.timeout_s = timeout_s

    def set(self, params: DelayParams) -> None:
        self._request({"op": "set", "params": params.to_dict()})

    def stats(self) -> dict[str, int]:
        reply = self._request({"op": "stats"})
        reply.pop("ok")
        return reply

    def _request(self, msg: dict) -> dict:
        directory, name = os.path.split(os.path.abspath(self.sock_path))
        own_path = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(own_path)
            sock.settimeout(self.timeout_s)
            sock.sendto(json.dumps(msg).encode(), self.sock_path)
            reply = json.loads(sock.recv(CONTROL_MAX))
        except TimeoutError:
            raise EmulationError(f"delay line at {self.sock_path} did not answer "
                                 f"{msg['op']!r} within {self.timeout_s} s") from None
        except OSError as exc:
            raise EmulationError(f"cannot reach delay line at {self.sock_path}: {exc}") from exc
        finally:
            sock.close()
            if os.path.lexists(own_path):
                os.unlink(own_path)
        if not reply.get("ok"):
            raise EmulationError(f"delay line at {self.sock_path} rejected {msg['op']!r}: "
                                 f"{reply.get('error')}")
        return reply


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m testbed.net.delayline",
                                 description="Userspace delay line for one link direction.")
    ap.add_argument("--in", dest="if_in", required=True, help="interface frames arrive on")
    ap.add_argument("--out", dest="if_out", required=True, help="interface to write them to")
    ap.add_argument("--control", required=True, help="UNIX datagram control socket path")
    ap.add_argument("--params", default="{}", help="DelayParams as JSON (default: no delay)")
    return ap.parse_args(argv)


def make_realtime(priority: int = RT_PRIORITY) -> bool:
    """Run this process under SCHED_FIFO at ``priority`` (root only): the delay line is the
    emulated network, and a role's compute on the same core must not make a frame late.
    It sleeps between frames, and the kernel's RT throttling (sched_rt_runtime_us) keeps
    5% of every second for other work even if it never did. False if not permitted."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, AttributeError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        params = DelayParams.from_json(args.params)
    except (ValueError, SpecError) as exc:
        print(f"delayline: bad --params: {exc}", file=sys.stderr)
        return 2
    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop.set)
    signal.signal(signal.SIGINT, stop.set)
    try:
        line = DelayLine(args.if_in, args.if_out, args.control, params)
    except (OSError, EmulationError) as exc:
        print(f"delayline: cannot start on {args.if_in}->{args.if_out}: {exc}", file=sys.stderr)
        return 1
    line.queue.stats.realtime = make_realtime()
    try:
        print("ready", flush=True)
        line.run(stop)
    except EmulationError as exc:
        print(f"delayline: {args.if_in}->{args.if_out}: {exc}", file=sys.stderr)
        return 1
    finally:
        line.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
