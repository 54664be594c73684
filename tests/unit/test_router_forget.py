"""The router forgets a request before its client hears the end of it: a client that
sends its next request as soon as it has one's DONE and REPORTs (the gateway's
admission frees a slot then) must not find the old one still counted against
limits.max_requests. Driven in-process, with peers that note what the router holds
at the moment each message is sent to them."""

from __future__ import annotations

import asyncio

from test_policies import router_with

from testbed.pdd.roles.router import Routed
from testbed.types import Pipeline
from testbed.pdd.wire.protocol import Done, FinishReason, Report, Role


class Watching:
    """A peer that records (message type, whether the router still holds the request)."""

    def __init__(self, role: Role, router, rid: int):
        self.role, self.router, self.rid = role, router, rid
        self.seen: list[tuple[str, bool]] = []

    async def send(self, rid, message):
        self.seen.append((type(message).__name__, self.rid in self.router.requests))
        await asyncio.sleep(0)  # a send may wait (the socket's buffers full)
        return True


def _routed(router, client) -> Routed:
    r = Routed(rid=41, client=client, client_rid=7, pipeline=Pipeline.P_MD,
               names={Role.PREFILL: "p0", Role.MAIN_DECODE: "md0"})
    router.requests[r.rid] = r
    return r


def test_reports_before_done_the_request_is_gone_when_the_client_gets_done():
    async def main():
        router = router_with()
        client = Watching(Role.CLIENT, router, 41)
        r = _routed(router, client)
        md = Watching(Role.MAIN_DECODE, router, 41)
        await router._from_role(md, r, Report(Role.PREFILL, "p0", {}))
        await router._from_role(md, r, Report(Role.MAIN_DECODE, "md0", {}))
        assert 41 in router.requests  # not over yet: DONE has not come
        await router._from_role(md, r, Done(4, FinishReason.LENGTH))
        assert client.seen == [("Report", True), ("Report", True), ("Done", False)]
        assert 41 not in router.requests
    asyncio.run(main())


def test_done_before_reports_the_request_is_gone_when_the_client_gets_the_last_report():
    async def main():
        router = router_with()
        client = Watching(Role.CLIENT, router, 41)
        r = _routed(router, client)
        md = Watching(Role.MAIN_DECODE, router, 41)
        await router._from_role(md, r, Done(4, FinishReason.LENGTH))
        assert 41 in router.requests  # its REPORTs are still to come
        await router._from_role(md, r, Report(Role.MAIN_DECODE, "md0", {}))
        await router._from_role(md, r, Report(Role.PREFILL, "p0", {}))
        assert client.seen == [("Done", True), ("Report", True), ("Report", False)]
        assert 41 not in router.requests
    asyncio.run(main())
