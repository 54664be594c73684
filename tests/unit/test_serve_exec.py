"""The pure parts of ``testbed serve`` and ``testbed exec`` (testbed.scenario.serve).

Neither command runs here (they build an emulated network, as root): these
check how exec finds a live host's namespace shell in the registry's state
files, the command lines they build, and the CLI's parsing of both.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed import cli
from testbed.errors import TestbedError
from testbed.pdd.roles.gateway import build_parser as gateway_parser
from testbed.scenario.serve import (exec_argv, find_host_shell, gateway_argv,
                                    read_state_files, serve_info)


def _run(prefix: str, *hosts: tuple[str, int]) -> dict:
    procs = [{"pid": pid, "start": pid * 10, "what": f"shell of {h}"} for h, pid in hosts]
    procs.append({"pid": 999, "start": 1, "what": "router router in router"})
    return {"prefix": prefix, "owner_pid": 1, "processes": procs}


def _alive(pid, start):
    return start == pid * 10


def test_exec_finds_the_live_hosts_shell():
    runs = [_run("tb0001", ("client", 11), ("md0", 12))]
    assert find_host_shell(runs, "md0", alive=_alive, owner_alive=lambda r: True) == \
        ("tb0001", 12)


def test_dead_owners_and_recycled_pids_are_not_live_hosts():
    runs = [_run("tb0001", ("client", 11)), _run("tb0002", ("client", 21))]
    runs[1]["processes"][0]["start"] = 5  # pid 21 now belongs to someone else
    dead_first = lambda r: r["prefix"] != "tb0001"  # noqa: E731
    with pytest.raises(TestbedError, match="no host 'client' in any live run"):
        find_host_shell(runs, "client", alive=_alive, owner_alive=dead_first)


def test_several_live_runs_need_a_prefix():
    runs = [_run("tb0001", ("client", 11)), _run("tb0002", ("client", 21))]
    with pytest.raises(TestbedError, match="several live runs.*--prefix"):
        find_host_shell(runs, "client", alive=_alive, owner_alive=lambda r: True)
    assert find_host_shell(runs, "client", "tb0002", alive=_alive,
                           owner_alive=lambda r: True) == ("tb0002", 21)
    with pytest.raises(TestbedError, match="no host 'p9' in run tb0002"):
        find_host_shell(runs, "p9", "tb0002", alive=_alive, owner_alive=lambda r: True)


def test_state_files_that_cannot_be_read_are_skipped(tmp_path):
    (tmp_path / "tb0001.json").write_text('{"prefix": "tb0001", "processes": []}')
    (tmp_path / "tb0002.json").write_text('{"prefix": "tb00')  # being written
    (tmp_path / "other.json").write_text("{}")
    assert read_state_files(tmp_path) == [{"prefix": "tb0001", "processes": []}]
    assert read_state_files(tmp_path / "none") == []


def test_exec_runs_the_command_through_mnexec():
    assert exec_argv(42, ["aiperf", "profile", "--url", "x"]) == \
        ["mnexec", "-a", "42", "aiperf", "profile", "--url", "x"]
    with pytest.raises(TestbedError, match="no command"):
        exec_argv(42, [])


def test_the_gateway_command_line_is_one_the_gateway_accepts(tmp_path):
    argv = gateway_argv(tmp_path / "cluster.json", "client", "10.0.0.5", 8000,
                        tmp_path / "requests.jsonl")
    assert argv[1:3] == ["-m", "testbed.pdd.roles.gateway"]
    args = gateway_parser().parse_args(argv[3:])
    assert (args.name, args.host, args.port, Path(args.out).name) == \
        ("client", "10.0.0.5", 8000, "requests.jsonl")


def test_serve_json_names_the_url_and_the_exec_command():
    info = serve_info("tb00ff", "pdd", {"host": "10.0.0.5", "host_name": "client"}, 8000,
                      "pdd-tiny")
    assert info["url"] == "http://10.0.0.5:8000/v1"
    assert info["exec"] == "testbed exec client -- COMMAND"


def test_the_cli_parses_serve_and_exec():
    ap = cli.build_parser()
    a = ap.parse_args(["serve", "topologies/two-dc.yaml", "--mode", "cross-dc-pd",
                       "--port", "9000"])
    assert (a.func, a.mode, a.port, a.topology) == (cli.cmd_serve, "cross-dc-pd", 9000,
                                                    "topologies/two-dc.yaml")
    a = cli.parse_args(["exec", "client", "--prefix", "tb0001", "--", "aiperf", "--url", "u"])
    assert (a.func, a.host, a.prefix, a.exec_command) == \
        (cli.cmd_exec, "client", "tb0001", ["aiperf", "--url", "u"])
    with pytest.raises(SystemExit):
        ap.parse_args(["serve", "--mode", "no-such-mode"])


def test_exec_keeps_every_argument_after_its_first_lone_dashdash():
    a = cli.parse_args(["exec", "client", "--", "aiperf", "profile", "--url", "u", "--",
                        "--isl", "5", "--"])
    assert a.exec_command == ["aiperf", "profile", "--url", "u", "--", "--isl", "5", "--"]
    a = cli.parse_args(["-v", "exec", "client", "--prefix", "tb0001", "--", "sh", "-c", "x"])
    assert (a.func, a.host, a.prefix, a.exec_command, a.verbose) == \
        (cli.cmd_exec, "client", "tb0001", ["sh", "-c", "x"], True)
    for argv in (["exec", "client", "aiperf", "--", "profile"],  # the command goes after --
                 ["exec", "client", "aiperf"], ["exec", "client", "--"]):
        with pytest.raises(SystemExit):
            cli.parse_args(argv)
    # other subcommands parse as before
    assert cli.parse_args(["validate", "--", "a.yaml"]).files == ["a.yaml"]


def test_serve_takes_a_client_command_after_its_lone_dashdash():
    a = cli.parse_args(["serve", "topologies/two-dc.yaml", "--mode", "pdd", "--out", "o",
                        "--mooncake-rows", "40", "--", "aiperf", "--url", "{url}", "--", "x"])
    assert (a.func, a.mode, a.mooncake_rows, a.client_command) == \
        (cli.cmd_serve, "pdd", 40, ["aiperf", "--url", "{url}", "--", "x"])
    assert cli.parse_args(["serve", "--mode", "pdd"]).client_command == []  # serve until ^C
    with pytest.raises(SystemExit):
        cli.parse_args(["serve", "--mode", "pdd", "--"])


def test_the_client_command_gets_the_live_deployments_addresses(tmp_path):
    from testbed.pdd.run.client_command import client_argv

    argv = client_argv(["aiperf", "--url", "{url}", "--base={base_url}", "-m", "{model}",
                        "--tokenizer", "{tokenizer}", "--input-file", "{trace}",
                        "--isl-block-size", "{block_tokens}",
                        "--artifact-dir", "{out}/aiperf", "{{literal}}"],
                       "10.0.0.5", 8000, tmp_path, "pdd-tiny", Path("/tok"), Path("/t.jsonl"), 8)
    assert argv == ["aiperf", "--url", "http://10.0.0.5:8000",
                    "--base=http://10.0.0.5:8000/v1", "-m", "pdd-tiny", "--tokenizer", "/tok",
                    "--input-file", "/t.jsonl", "--isl-block-size", "8",
                    "--artifact-dir", f"{tmp_path}/aiperf", "{literal}"]
    with pytest.raises(TestbedError, match=r"'\{urll\}'.*unknown placeholder \{urll\}"):
        client_argv(["{urll}"], "10.0.0.5", 8000, tmp_path, "m", Path("/t"), Path("/t"))
    with pytest.raises(TestbedError, match="client command argument"):
        client_argv(["{"], "10.0.0.5", 8000, tmp_path, "m", Path("/t"), Path("/t"))


@pytest.fixture
def live_run(tmp_path, monkeypatch):
    """A live run's state file in a temporary state dir; exec runs commands directly
    (no namespace, no root) in place of ``mnexec -a PID``."""
    from testbed.net import naming, registry
    from testbed.scenario import serve

    monkeypatch.setattr(naming, "STATE_DIR", tmp_path)
    monkeypatch.setattr(serve, "find_host_shell", lambda recs, host, prefix: ("tb0b01", 1))
    monkeypatch.setattr(serve, "exec_argv", lambda pid, command: command)
    reg = registry.Registry("tb0b01")
    reg.open()
    yield reg
    reg.teardown()


def naming_alive(pid):
    from testbed.net import naming

    return naming.process_alive(pid, None)


def _attached():
    from testbed.net import naming

    return json.loads(naming.state_file("tb0b01").read_text())["attached"]


def test_an_exec_command_is_in_the_state_file_while_it_runs(live_run, tmp_path):
    from testbed.net import naming
    from testbed.scenario.serve import run_in_host

    seen = tmp_path / "seen.json"
    code = ("import json, os, sys; rec = json.load(open(sys.argv[1])); "
            "json.dump({'pid': os.getpid(), 'attached': rec['attached']}, open(sys.argv[2], 'w')); "
            "sys.exit(3)")
    assert run_in_host("client", [sys.executable, "-c", code,
                                  str(naming.state_file("tb0b01")), str(seen)]) == 3
    inside = json.loads(seen.read_text())
    assert [e["pid"] for e in inside["attached"]] == [inside["pid"]]
    assert inside["attached"][0]["what"].startswith(f"exec {sys.executable} -c ")
    assert _attached() == []  # removed when it ended


def test_the_runs_teardown_stops_a_running_exec_command(live_run):
    from testbed.scenario.serve import run_in_host

    result = {}
    t = threading.Thread(target=lambda: result.update(
        code=run_in_host("client", [sys.executable, "-c", "import time; time.sleep(60)"])))
    t.start()
    deadline = time.monotonic() + 10
    while not _attached() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [e["what"].split()[0] for e in _attached()] == ["exec"]
    pid = _attached()[0]["pid"]
    live_run.stop_attached()
    t.join(10)
    # the exit code is not checked: here the owner is exec's own process, so
    # stop_process may reap the command before exec's wait does
    assert not t.is_alive() and "code" in result
    assert not naming_alive(pid)
    assert _attached() == []


def test_serve_with_a_scenario_takes_its_deployment_and_load(tmp_path, monkeypatch):
    """`testbed serve --scenario FILE`: the scenario's topology, the mode's pdd settings,
    seed, and its workload for {trace}; conflicting or unknown choices fail before
    anything is built, naming what is wrong."""
    from testbed.scenario import serve as serve_mod
    from testbed.spec.scenario import load_scenario

    seen = {}
    monkeypatch.setattr(serve_mod, "serve",
                        lambda topo, mode, opts: seen.update(topo=topo, opts=opts)
                        or {"checked": 0, "mismatched": []})
    scen = "scenarios/mooncake-trace.yaml"
    sc = load_scenario(scen)
    args = ["serve", "--scenario", scen, "--mode", "pdd", "--out", str(tmp_path)]
    assert cli.main(args + ["--", "c", "{trace}", "{block_tokens}"]) == 0
    opts = seen["opts"]
    assert seen["topo"] == sc.topology and opts.pdd == sc.modes[0].pdd != type(opts.pdd)()
    assert (opts.workload, opts.seed, opts.command) == \
        (sc.workload, sc.seed, ("c", "{trace}", "{block_tokens}"))
    seen.clear()

    def refused(argv: list[str], match: str) -> None:
        with pytest.raises(TestbedError, match=match):
            cli.cmd_serve(cli.parse_args(argv))
        assert cli.main(argv) == 2 and seen == {}  # refused before serve was called

    refused(["serve", "topologies/two-dc.yaml", *args[1:]], "not both")
    refused(args + ["--mooncake-rows", "5"], "--mooncake-rows")
    refused(["serve", "--scenario", scen, "--mode", "p-rld", "--out", str(tmp_path)],
            r"mooncake-trace.yaml.*modes.*p-rld")
    refused(["serve", "--mode", "pdd", "--out", str(tmp_path), "--", "c", "{trac}"],
            r"unknown placeholder \{trac\}")
