"""Helper process for signal tests: build the default network, say 'up PREFIX', wait."""

import sys
import time

from testbed.net.build import open_network
from testbed.spec.topology import load_topology

with open_network(load_topology(sys.argv[1])) as net:
    print("up", net.plan.prefix, flush=True)
    time.sleep(120)
