"""Every testbed command stops on SIGINT the same way, also when its parent started it
with SIGINT ignored (a background job of a non-interactive shell)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

# main() with a subcommand that only waits: what `testbed serve` does between its start and
# its teardown (the teardown itself is the subcommand's, tested with it)
CHILD = textwrap.dedent("""
    import sys, time, types
    from testbed import cli

    def wait(args):
        print("waiting", flush=True)
        time.sleep(60)
        return 0

    cli.parse_args = lambda argv: types.SimpleNamespace(verbose=False, func=wait)
    sys.exit(cli.main([]))
""")


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `cmd &` in a script does


def test_sigint_stops_a_command_started_with_sigint_ignored():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err
