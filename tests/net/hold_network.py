"""Helper process for signal tests: build the default network, say 'up PREFIX', wait.

Like every testbed command it owns its SIGINT first (``testbed.cli.own_sigint``): a
parent that started it with SIGINT ignored (a background job of a non-interactive
shell) must not make ``kill -INT`` a no-op."""

import sys
import time

from testbed.cli import own_sigint
from testbed.net.build import open_network
from testbed.spec.topology import load_topology

own_sigint()

with open_network(load_topology(sys.argv[1])) as net:
    print("up", net.plan.prefix, flush=True)
    time.sleep(120)
