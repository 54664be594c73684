"""The client started while no router answers: it does not crash; each request waits
for the router within its timeout and then fails with the reason (every request ends
with a record; reconnecting after a loss: tests/unit/test_router_restart.py)."""

from __future__ import annotations

import asyncio

from pdd_fixtures import small_config

from testbed.pdd.roles.client import Client
from testbed.pdd.roles.client_record import ClientRequest


class Refused:
    """A transport whose every connect is refused, counting the attempts."""

    def __init__(self):
        self.attempts = 0

    async def connect(self, host, port):
        self.attempts += 1
        raise ConnectionRefusedError(111, f"Connect call failed ({host!r}, {port})")


def test_requests_fail_with_the_reason_when_the_router_never_answers():
    cfg = small_config("pdd", client={"request_timeout_s": 0.6, "report_grace_s": 0.1})
    transport = Refused()
    reqs = [ClientRequest(i, 0.05 * i, tuple(range(1, 33)), 4, None) for i in range(3)]
    records = asyncio.run(Client(cfg, transport).run(reqs))
    assert [r["status"] for r in records] == ["failed"] * 3
    assert all(r["reason"] == "router unreachable for 0.6 s (request_timeout_s)"
               for r in records)
    assert transport.attempts >= 3  # it kept trying (every RECONNECT_S)
