"""Late binding: a request that would wait in P's queue is decided when its prefill
starts (P's STARTED), not when it arrives, so a WAN dip that begins while it queues
is in its decision. Driven in-process with peers that record what the router sends."""

from __future__ import annotations

import asyncio
import time

from test_policies import router_with

from testbed.decision import Decision
from testbed.pdd.wire.protocol import Bind, Cancel, Report, Request, Role, Started


class _Open:
    closed = False


class Recording:
    """A peer that records every message sent to it."""

    def __init__(self, role: Role, name: str):
        self.role, self.name, self.outbound, self.conn = role, name, True, _Open()
        self.sent: list = []

    async def send(self, rid, message):
        self.sent.append((rid, message))
        return True


def _router_and_peers():
    router = router_with()
    peers = {n: Recording(role, n) for n, role in (("p0", Role.PREFILL), ("p1", Role.PREFILL),
                                                   ("rld0", Role.RELAY_DECODE),
                                                   ("rld1", Role.RELAY_DECODE),
                                                   ("md0", Role.MAIN_DECODE),
                                                   ("md1", Role.MAIN_DECODE))}
    router._out.update(peers)
    return router, peers, Recording(Role.CLIENT, "client")


# 100 real tokens (x token_scale 32, at the model's KV bytes per token): ~0.28 s to MD on
# the config's 10 Gbit/s line, under the relay threshold; ~1.4 s at 1 Gbit/s, over it
PROMPT = tuple(range(1, 101))


def _slow_wan(router, gbit: float) -> None:
    now = time.monotonic()
    for i in range(5):  # busy intervals at this rate: the capacity estimate follows
        router.wan.add_rate_sample(now - 0.1 * (4 - i), gbit * 1e9 / 8 * 0.1, 0.1, True)


def test_a_queued_request_is_decided_at_its_prefill_start_on_the_wan_of_that_moment():
    async def main():
        router, peers, client = _router_and_peers()
        now = time.monotonic()
        router.p_free_at.update(p0=now + 5.0, p1=now + 5.0)  # both busy: it queues
        await router._route(client, 7, Request(PROMPT, 300, {"session": "s"}))
        (rid, req), = [m for p in ("p0", "p1") for m in peers[p].sent]
        p = "p0" if peers["p0"].sent else "p1"
        assert req.metadata["bind"] == "late" and "pipeline" not in req.metadata
        assert client.sent == []  # no decision yet
        r = router.requests[rid]
        assert r.pipeline is None and set(r.names) == {Role.PREFILL}
        assert router.p_free_at[p] > now + 5.0  # P's queue took it at arrival

        _slow_wan(router, 1.0)  # the WAN dips to 10% while it waits
        await router._from_role(peers[p], r, Started(0))
        (_, report), = client.sent
        d = Decision.read(report.data)
        assert d.pipeline == "p-rld-md", d.reason  # the dip is in the decision
        assert d.t_arrival is not None and d.routing.t_route > d.t_arrival
        assert d.routing.wan_gbit < 1.5
        (_, bind), = [m for m in peers[p].sent if isinstance(m[1], Bind)]
        assert bind.metadata == {"pipeline": "p-rld-md", "rld": d.instances["RELAY_DECODE"],
                                 "md": d.instances["MAIN_DECODE"]}
        assert r.pipeline.value == "p-rld-md" and Role.MAIN_DECODE in r.names
        assert router.rld_active[d.instances["RELAY_DECODE"]] == 1
        await router._from_role(peers[p], r, Started(0))  # a second STARTED changes nothing
        assert len(client.sent) == 1
    asyncio.run(main())


def test_the_same_request_with_p_free_is_decided_on_arrival_on_the_fast_line():
    async def main():
        router, peers, client = _router_and_peers()
        _slow_wan(router, 10.0)
        await router._route(client, 7, Request(PROMPT, 300, {"session": "s"}))
        (_, report), = client.sent
        d = Decision.read(report.data)
        assert d.pipeline == "p-md" and d.t_arrival is None  # the full line: nothing to hide
        (_, req), = peers["p0"].sent
        assert req.metadata["pipeline"] == "p-md" and "bind" not in req.metadata
    asyncio.run(main())


def test_an_unbound_request_that_ends_tells_the_client_why_it_has_no_pipeline():
    async def main():
        router, peers, client = _router_and_peers()
        now = time.monotonic()
        router.p_free_at.update(p0=now + 5.0, p1=now + 5.0)
        await router._route(client, 7, Request(PROMPT, 300, {}))
        p = "p0" if peers["p0"].sent else "p1"
        await router.on_peer_lost(peers[p])  # P dies with it queued
        reports = [m for _, m in client.sent if isinstance(m, Report)]
        d = Decision.read(reports[0].data)
        assert d.pipeline is None and d.roles == () and d.t_arrival is not None
        assert d.reason.startswith("ended before its prefill started: PREFILL lost")
        assert any(not isinstance(m, Report) for _, m in client.sent)  # the ERROR
        assert not any(isinstance(m, Cancel) for _, m in peers[p].sent)  # P is gone
    asyncio.run(main())


def test_a_burst_at_one_p_is_bound_request_by_request_as_each_prefill_starts():
    """Five requests at once on one P, then two more (the in-process cluster, fake WAN):
    one that finds P free is decided on arrival, one that queues when its prefill
    starts (its decision waited as long as P's queue did); the relayed pipelines
    occur among the late ones (their local path starts once bound), and every token
    is exact."""
    from pdd_fixtures import run, run_on_fake_wan, small_config

    from testbed.pdd.roles.client_record import ClientRequest
    from testbed.pdd.run.verify import verify_records

    import random
    rng = random.Random(5)
    sizes = [(0.0, 128, 100), (0.0, 110, 100), (0.0, 150, 40), (0.0, 128, 60),
             (0.0, 90, 80), (0.9, 130, 60), (0.905, 20, 30)]
    reqs = [ClientRequest(i, at, tuple(rng.randrange(512) for _ in range(n)), out, f"s{i}")
            for i, (at, n, out) in enumerate(sizes)]
    cfg = small_config("pdd")
    records = run(run_on_fake_wan(cfg, reqs))[0]
    assert [r["status"] for r in records] == ["completed"] * 7, [r["reason"] for r in records]
    assert all(v.match for v in verify_records(records, cfg.model))
    assert all(r["tokens_lost"] == 0 and r["tokens_duplicated"] == 0 for r in records)
    late = 0
    for r in records:
        d, p = Decision.of_record(r), r["reports"]["P"]
        if d.t_arrival is None:
            assert p["queue_s"] < 0.05  # decided on arrival: it did not queue
            continue
        late += 1
        waited = d.routing.t_route - d.t_arrival
        assert abs(waited - p["queue_s"]) < 0.05, (waited, p["queue_s"])
    assert late >= 4
    assert {r["pipeline"] for r in records if Decision.of_record(r).t_arrival} \
        >= {"p-rld-md", "rld-only"}  # the local path starts once bound
