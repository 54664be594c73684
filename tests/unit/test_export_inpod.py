"""What runs in the exported pods (testbed.export.inpod): the client's HTTP gate the
Workflow polls, and the trigger that starts an iperf3 client on POST /start."""

from __future__ import annotations

import subprocess
import sys
import time

from http_fixtures import http_status

from testbed.export.inpod import Gate, serve_gate, wait_connectable
from testbed.pdd.run.procs import free_port


def test_gate_answers_503_until_ready_and_start_only_once_ready():
    gate, port = Gate(), free_port()
    server = serve_gate(gate, port)
    try:
        base = f"http://127.0.0.1:{port}"
        assert http_status(base + "/ready") == 503
        assert http_status(base + "/start", "POST") == 503 and not gate.start.is_set()
        gate.ready.set()
        assert http_status(base + "/ready") == 200
        assert http_status(base + "/start", "POST") == 200 and gate.start.is_set()
        assert http_status(base + "/start", "POST") == 200  # a StatusCheck retry is harmless
        assert http_status(base + "/nothing") == 503
        assert http_status(base + "/exit", "POST") == 200 and gate.exit.is_set()
    finally:
        server.shutdown()


def test_trigger_runs_its_command_once_started_and_returns_its_exit_code(tmp_path):
    port, marker = free_port(), tmp_path / "ran"
    proc = subprocess.Popen([sys.executable, "-m", "testbed.export.inpod", "trigger", "--port",
                             str(port), "--", sys.executable, "-c",
                             f"open({str(marker)!r}, 'w').write('x'); raise SystemExit(3)"])
    try:
        deadline = time.monotonic() + 30
        while http_status(f"http://127.0.0.1:{port}/ready") != 200:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        assert not marker.exists()  # nothing runs before the Workflow says so
        assert http_status(f"http://127.0.0.1:{port}/start", "POST") == 200
        assert proc.wait(timeout=30) == 3 and marker.read_text() == "x"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_wait_listening_returns_once_every_port_accepts():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        wait_connectable([("127.0.0.1", s.getsockname()[1])], timeout_s=5)


CHILD = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
time.sleep(1.0)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_role_is_ready_once_it_prints_ready_and_gets_the_pods_sigterm():
    import signal

    port = free_port()
    wrapper = (f"import sys; from testbed.export.inpod import run_gated; "
               f"sys.exit(run_gated([sys.executable, '-c', {CHILD!r}], {port}))")
    proc = subprocess.Popen([sys.executable, "-c", wrapper], stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while http_status(f"http://127.0.0.1:{port}/ready") != 503:  # serving, child not ready
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        while http_status(f"http://127.0.0.1:{port}/ready") != 200:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 7  # the child's exit code, after the passed-on SIGTERM
        assert proc.stdout.read().strip() == b"ready"  # its stdout is passed on too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
