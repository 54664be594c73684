"""testbed.bench.health_probe: the figures it summarizes, the processes it finds, one
health request against a real HTTP server."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time

import pytest

from testbed.bench.health_probe import probe_health, role_processes, rss_mb, summarize


def test_the_summary_counts_slow_and_failed_answers_and_peaks():
    samples = [{"t": t, "health_ms": ms, "status": st, "rss_mb": {"md0": mb}, "late_ms": late}
               for t, ms, st, mb, late in [(0, 2.0, 200, 100, 0.1), (60, 150.0, 200, 130, 40.0),
                                           (120, 3.0, "URLError", 160, 0.2)]]
    s = summarize(samples)
    assert s["probe_late_ms"]["max"] == 40.0
    assert (s["samples"], s["health_not_200"], s["health_over_100ms"]) == (3, 1, 1)
    assert s["health_ms"]["max"] == 150.0 and s["rss_peak_mb"] == {"md0": 160}
    assert s["rss_slope_mb_per_min"]["md0"] == pytest.approx(30.0)


def test_role_processes_are_found_by_module_and_instance_name():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                             "testbed.pdd.run.node", "cluster.json", "md7"])
    try:
        deadline = time.monotonic() + 5
        while "md7" not in role_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert role_processes()["md7"] == proc.pid and rss_mb(proc.pid) > 1
    finally:
        proc.kill()
        proc.wait()


def test_one_health_request_gives_its_status_and_latency():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        ms, status, connect_ms = probe_health(base + "/health")
        assert status == 200 and 0 <= connect_ms <= ms < 5000
        assert probe_health(base + "/other")[1] == 503
    finally:
        server.shutdown()
        server.server_close()
    assert probe_health(base + "/health")[1:] == ("ConnectionRefusedError", None)
