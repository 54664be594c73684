"""The router killed (SIGKILL) and started again while a workload runs, each role its
own process on loopback TCP (no root).

What must hold (docs/pdd-roles.md, failure table): the roles drop what the dead
router routed to them; the client connects to the restarted router and resumes
every interrupted request from its first missing position; requests arriving
while no router answers wait for it; every request completes with exact tokens
(a single-process greedy decode), none lost or delivered twice.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
from pdd_fixtures import small_config

from testbed.decision import Decision
from testbed.pdd.roles.client import Client
from testbed.pdd.roles.client_record import ClientRequest
from testbed.pdd.run.procs import RoleProcesses, loopback_config
from testbed.pdd.run.verify import verify_records
from testbed.pdd.wire.transport import TcpTransport

# arrivals over SPAN_S: long enough that requests still arrive after the restarted router
# is up even when starting it takes seconds (a loaded machine: at 6 s, none came after)
N, SPAN_S, KILL_AT_S, DOWN_S = 48, 12.0, 2.0, 1.0


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = loopback_config(small_config("pdd", timing={"connect_timeout_s": 20.0},
                                       client={"request_timeout_s": 60.0}))
    rng = random.Random(29)
    reqs = [ClientRequest(i, SPAN_S * i / N, tuple(rng.randrange(512) for _ in range(96)), 80,
                          f"s{i}") for i in range(N)]
    with RoleProcesses(cfg, tmp_path_factory.mktemp("router-restart")) as procs:
        procs.start()
        client = Client(cfg, TcpTransport(), "client")
        out: dict = {}
        thread = threading.Thread(target=lambda: out.update(
            records=asyncio.run(client.run(reqs))))
        t0 = time.monotonic()
        thread.start()
        time.sleep(KILL_AT_S)
        procs.signal("router")
        procs.procs["router"].wait(10)
        t_kill = time.monotonic()
        time.sleep(DOWN_S)
        procs.start_one("router")
        t_back = time.monotonic()
        thread.join(120)
        assert not thread.is_alive(), "the client did not finish"
        yield procs, client, out["records"], (t_kill - t0, t_back - t0)


def test_every_request_completes_with_exact_tokens(run):
    procs, _, records, _ = run
    assert [r["status"] for r in records] == ["completed"] * N, \
        [(r["id"], r["reason"]) for r in records if r["status"] != "completed"]
    assert sum(r["tokens_lost"] for r in records) == 0
    assert sum(r["tokens_duplicated"] for r in records) == 0
    assert all(v.match for v in verify_records(records, procs.cfg.model))


def test_interrupted_requests_were_resumed_from_their_first_missing_position(run):
    procs, client, records, (t_kill, t_back) = run
    resumed = [r for r in records
               if any(x.lost == "ROUTER" for x in Decision.of_record(r).reserves)]
    print(f"killed at {t_kill:.2f} s, back at {t_back:.2f} s; {len(resumed)} of {N} resumed")
    assert client.reconnects == 1 and resumed
    for r in resumed:
        k = Decision.of_record(r).reserves[-1].from_position
        assert 0 <= k < r["max_out"] and "re-served" in r["pipeline"]
    # the roles dropped what the dead router had routed to them
    logs = "".join((procs.run_dir / f"{n}.log").read_text() for n in ("p0", "rld0", "md0"))
    assert "the router router is gone" in logs


def test_requests_sent_after_the_restart_were_served_by_the_new_router(run):
    _, _, records, (_, t_back) = run
    late = [r for r in records if r["arrival_s"] > t_back + 0.5]
    assert late, f"the router was back at {t_back:.2f} s, after the last arrival"
    assert all(r["status"] == "completed" and not Decision.of_record(r).reserves
                        for r in late)


class _Conn:
    closed = False


def test_a_round_takes_frames_only_from_the_connections_it_was_routed_over():
    """A restarted RLD (a new connection of instance rld0) working on a request the router
    had routed to the one before it is not that request's RLD: its frames are refused
    (the router cancels them there), while MD, not connected at routing, is bound to its
    first connection."""
    from testbed.pdd.roles.peers import Peer
    from testbed.pdd.roles.router import Routed
    from testbed.types import Pipeline
    from testbed.pdd.wire.fields import Role

    p, rld = Peer(_Conn(), Role.PREFILL, "p0", True), Peer(_Conn(), Role.RELAY_DECODE, "rld0", True)
    r = Routed(1, None, 1, Pipeline.P_RLD_MD,
               {Role.PREFILL: "p0", Role.RELAY_DECODE: "rld0", Role.MAIN_DECODE: "md0"})
    r.bind({"p0": p, "rld0": rld})
    assert r.from_this_round(p) and r.from_this_round(rld)
    assert not r.from_this_round(Peer(_Conn(), Role.RELAY_DECODE, "rld0", True))
    md = Peer(_Conn(), Role.MAIN_DECODE, "md0", True)
    assert r.from_this_round(md) and not r.from_this_round(
        Peer(_Conn(), Role.MAIN_DECODE, "md0", True))
