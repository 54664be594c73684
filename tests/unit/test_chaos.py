"""The leftover detection and the outcome judgment of ``testbed bench chaos``
(testbed/scenario/chaos.py), pure.

Snapshots are built by hand, or read from a fake /proc, /sys/class/net and
state folder in tmp_path; nothing is started or killed.
"""

from __future__ import annotations

import json
import os

import pytest

from testbed.scenario.chaos import (Process, Snapshot, cycle_target, judge_outcome, role_pids,
                                    snapshot_leftovers, take_snapshot)

ROOT_NS = "net:[4026531840]"
BEFORE = Snapshot(links=frozenset({"lo", "eth0", "docker0"}), netns=frozenset({ROOT_NS}),
                  processes=(Process(1, 10, "/sbin/init", ROOT_NS),
                             Process(500, 900, "sshd: root", ROOT_NS)),
                  state=frozenset({"tb00aa.json"}))
MARK = "/tmp/testbed-chaos-x/cycle-003"


def after(**kw) -> Snapshot:
    fields = {"links": BEFORE.links, "netns": BEFORE.netns, "processes": BEFORE.processes,
              "state": BEFORE.state}
    fields.update(kw)
    return Snapshot(**fields)


def test_a_clean_cycle_leaves_nothing():
    assert snapshot_leftovers(BEFORE, after(), MARK) == []


def test_what_existed_before_is_never_a_leftover_even_if_it_looks_like_the_testbeds():
    before = after(links=BEFORE.links | {"tb1234sa"}, state=BEFORE.state | {"tb1234.json"})
    assert snapshot_leftovers(before, before, MARK) == []


def test_new_interfaces_namespaces_and_state_are_named_exactly():
    ns = "net:[4026532999]"
    shell = Process(4242, 77, "bash --norc -is mininet:p0", ns)
    got = snapshot_leftovers(BEFORE, after(links=BEFORE.links | {"tb9f3asa", "tb9f3asa-1"},
                                  netns=BEFORE.netns | {ns, "netns:blue"},
                                  processes=BEFORE.processes + (shell,),
                                  state=BEFORE.state | {"tb9f3a.json", "tb9f3a"}), MARK)
    assert got == ["interface tb9f3asa", "interface tb9f3asa-1",
                   "network namespace net:[4026532999] (held by pids [4242])",
                   "network namespace netns:blue",
                   "process 4242 (bash --norc -is mininet:p0)",
                   "state /run/testbed/tb9f3a", "state /run/testbed/tb9f3a.json"]


def test_a_new_process_counts_only_if_it_belongs_to_the_cycle():
    role = Process(600, 5, f"python -m testbed.pdd.run.node {MARK}/pdd/cluster.json md0", ROOT_NS)
    other = Process(601, 5, "python -m pytest -q tests/unit", ROOT_NS)  # someone else's
    older_run = Process(602, 5, "python -m testbed.pdd.run.node /tmp/other/cluster.json p0", ROOT_NS)
    got = snapshot_leftovers(BEFORE, after(processes=BEFORE.processes + (role, other, older_run)),
                             MARK)
    assert got == [f"process 600 (python -m testbed.pdd.run.node {MARK}/pdd/cluster.json md0)"]


def test_a_recycled_pid_is_a_new_process():
    recycled = Process(500, 1234, f"testbed run x --out {MARK}", ROOT_NS)  # sshd's pid, later
    got = snapshot_leftovers(BEFORE, after(processes=(BEFORE.processes[0], recycled)), MARK)
    assert got == [f"process 500 (testbed run x --out {MARK})"]


def test_take_snapshot_reads_processes_namespaces_interfaces_and_state(tmp_path):
    proc, net, state, netns = (tmp_path / d for d in ("proc", "net", "state", "netns"))
    for d in (net / "lo", net / "tb0001sa", state / "tb0001", netns / "red"):
        d.mkdir(parents=True)
    (state / "tb0001.json").write_text("{}")
    for pid, cmd, ns in ((1, b"/sbin/init\0", ROOT_NS), (77, b"bash\0-is\0", "net:[4026532001]"),
                         (78, b"", None)):  # 78: a kernel thread, nothing readable
        (proc / str(pid) / "ns").mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(cmd)
        if ns:
            os.symlink(ns, proc / str(pid) / "ns" / "net")
    (proc / "self").mkdir()
    snap = take_snapshot(proc, net, netns, state)
    assert snap.links == {"lo", "tb0001sa"}
    assert snap.netns == {ROOT_NS, "net:[4026532001]", "netns:red"}
    assert sorted((p.pid, p.cmdline, p.netns) for p in snap.processes) == [
        (1, "/sbin/init", ROOT_NS), (77, "bash -is", "net:[4026532001]")]
    assert snap.state == {"tb0001", "tb0001.json"}


def test_role_pids_come_from_the_runners_own_state_file(tmp_path):
    procs = [{"pid": 10, "start": 1, "what": "shell of p0h"},
             {"pid": 11, "start": 2, "what": "prefill p0 in p0h"},
             {"pid": 12, "start": 3, "what": "router router in rh"},
             {"pid": 13, "start": 4, "what": "client client in ch"}]
    (tmp_path / "tb0001.json").write_text(json.dumps({"owner_pid": 99, "processes": procs}))
    (tmp_path / "tb0002.json").write_text(json.dumps(
        {"owner_pid": 98, "processes": [{"pid": 20, "start": 1, "what": "prefill p0 in x"}]}))
    (tmp_path / "tb0003.json").write_text("{not json")
    assert role_pids(tmp_path, 99) == [(11, 2, "prefill p0 in p0h"),
                                       (12, 3, "router router in rh")]
    assert role_pids(tmp_path / "absent", 99) == []


def write_run(run, records, workload_ids=(0, 1, 2, 3), warmup_ids=(), summary=True):
    mode = run / "pdd"
    mode.mkdir(parents=True)
    with (mode / "workload.jsonl").open("w") as fh:
        for i in warmup_ids:
            fh.write(json.dumps({"id": i, "warmup": True}) + "\n")
        for i in workload_ids:
            fh.write(json.dumps({"id": i}) + "\n")
    (mode / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records)
                                         + '{"id": 3, "status": "compl')  # cut last line
    (mode / "events.jsonl").write_text('{"kind": "network_up"}\n{"kind": "workload_start"}\n')
    if summary:
        (run / "summary.json").write_text("{}")
    return run


def rec(i, status="completed", reason=None, dup=0):
    return {"id": i, "status": status, "reason": reason, "tokens_duplicated": dup}


def test_failures_with_reasons_are_an_outcome(tmp_path):
    run = write_run(tmp_path / "r", [rec(0), rec(1), rec(2, "failed", "router connection lost"),
                                      rec(3, "failed", "router connection lost")],
                    warmup_ids=(90,))
    modes, problems = judge_outcome(run, 1)
    assert problems == []
    assert modes["pdd"] == {"requests": 4, "completed": 2, "failed": 2, "missing": 0,
                            "unexplained": 0, "tokens_duplicated": 0,
                            "reasons": {"router connection lost": 2}}


def test_a_lost_request_a_silent_failure_and_a_duplicated_token_are_problems(tmp_path):
    # id 3's only line is cut mid-way: no record; id 1 failed without a reason; id 2 repeated
    run = write_run(tmp_path / "r", [rec(0), rec(1, "failed"), rec(2, dup=3)])
    modes, problems = judge_outcome(run, 0)
    assert modes["pdd"]["missing"] == 1 and modes["pdd"]["unexplained"] == 1
    assert problems == ["pdd: 1 requests without a record",
                        "pdd: 1 requests not completed that give no reason",
                        "pdd: 3 tokens delivered twice"]


def test_a_run_that_did_not_report_is_a_problem(tmp_path):
    run = write_run(tmp_path / "r", [rec(i) for i in range(4)], summary=False)
    _, problems = judge_outcome(run, -9)
    assert problems[0] == "the runner exited -9, not 0 or 1 (a run that reported)"
    assert "did not report" in problems[1]
    assert judge_outcome(tmp_path / "absent", 1)[1][-1].startswith("no mode folder")


def test_a_kill_before_the_workload_started_is_a_start_failure(tmp_path):
    run = write_run(tmp_path / "r", [], summary=False)
    (run / "pdd" / "events.jsonl").write_text('{"kind": "network_up"}\n')
    assert judge_outcome(run, 2) == ({}, [])  # the runner said why and exited 2
    _, problems = judge_outcome(run, 0)  # a run that says it passed without starting
    assert any("did not report" in p for p in problems)


def test_cycle_targets():
    assert [cycle_target(i, "alternate") for i in range(3)] == ["runner", "role", "runner"]
    assert cycle_target(5, "router") == "router"
    with pytest.raises(ValueError, match="kill: expected one of"):
        cycle_target(0, "gateway")
