"""RouterLink frees a request's admission slot once every REPORT is in (the router has
let it go), not when its record is written at the grace: a relayed request's WAN
transfer goes on after its DONE and the router holds it until MD's REPORT. A REPORT
that never comes holds the slot request_timeout_s at most. In-process, over the fake
transport, with the test playing the router."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from pdd_fixtures import small_config

from testbed.decision import Decision, Routing
from testbed.pdd.roles.gateway_link import RouterLink
from testbed.pdd.wire.fake_transport import FakeNetwork
from testbed.pdd.wire.protocol import Done, FinishReason, Frame, Report, Role, Tokens

ROUTING = Routing(**{f.name: 1 for f in dataclasses.fields(Routing)} | {"policy": "pdd"})
RELAYED = Decision("p-rld-md", "relay", "pdd", ("MAIN_DECODE", "PREFILL", "RELAY_DECODE"),
                   {"MAIN_DECODE": "md0", "PREFILL": "p0", "RELAY_DECODE": "rld0"}, ROUTING)


async def _link(tmp_path, grace_s: float, timeout_s: float):
    cfg = small_config(client={"report_grace_s": grace_s, "request_timeout_s": timeout_s})
    net = FakeNetwork()
    router = cfg.of_role(Role.ROUTER)[0]
    accepted: asyncio.Queue = asyncio.Queue()

    async def handler(conn):
        await accepted.put(conn)
        await asyncio.Event().wait()  # held open; the test plays the router on it

    await net.host(router.host).serve(router.host, router.port, handler)
    link = RouterLink(cfg, "client", net.host("client"), tmp_path / "requests.jsonl")
    await link.connect()
    conn = await accepted.get()
    await conn.recv()  # HELLO
    return link, conn


async def _served_and_done(link, conn):
    live = await link.open((5, 6, 7), 2, None, {}, 0.0)
    rid = (await conn.recv()).request_id  # the REQUEST
    for msg in (Report(Role.ROUTER, "router", RELAYED.data()),
                Tokens(Role.RELAY_DECODE, 0, (1, 2)), Done(2, FinishReason.LENGTH),
                Report(Role.RELAY_DECODE, "rld0", {}), Report(Role.PREFILL, "p0", {})):
        await conn.send(Frame(rid, msg))
    while not live.over:
        await asyncio.sleep(0.005)
    return live, rid


def test_the_slot_is_freed_when_the_last_report_comes_not_at_the_grace(tmp_path):
    async def main():
        link, conn = await _link(tmp_path, grace_s=0.05, timeout_s=30.0)
        live, rid = await _served_and_done(link, conn)
        freed = []
        link.finish(live, on_released=lambda: freed.append(asyncio.get_running_loop().time()))
        await asyncio.sleep(0.3)  # past the grace: recorded, MD's REPORT still out
        link._flush_out()
        rec = json.loads((tmp_path / "requests.jsonl").read_text())
        assert rec["status"] == "completed" and set(rec["reports"]) == {"RLD", "P", "router"}
        assert freed == []  # the router still holds it: so does the slot
        await conn.send(Frame(rid, Report(Role.MAIN_DECODE, "md0", {"cancelled": True})))
        await asyncio.sleep(0.05)
        assert len(freed) == 1
        await link.close()
        assert len(freed) == 1  # once
    asyncio.run(main())


def test_a_report_that_never_comes_holds_the_slot_request_timeout_s_at_most(tmp_path):
    async def main():
        link, conn = await _link(tmp_path, grace_s=0.05, timeout_s=0.3)
        live, _ = await _served_and_done(link, conn)
        freed = []
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        link.finish(live, on_released=lambda: freed.append(loop.time() - t0))
        await asyncio.sleep(0.2)
        assert freed == []
        await asyncio.sleep(0.5)
        assert len(freed) == 1 and freed[0] >= 0.05 + 0.3
        await link.close()
    asyncio.run(main())


def test_losing_the_router_frees_what_waited_for_its_reports(tmp_path):
    async def main():
        link, conn = await _link(tmp_path, grace_s=0.05, timeout_s=30.0)
        live, _ = await _served_and_done(link, conn)
        freed = []
        link.finish(live, on_released=lambda: freed.append(1))
        await asyncio.sleep(0.2)
        assert freed == []
        conn.close()
        await asyncio.sleep(0.1)
        assert freed == [1]
        await link.close()
        assert freed == [1]
    asyncio.run(main())
