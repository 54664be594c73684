"""``testbed export k8s``: every exported manifest of every scenario validates against
the Kubernetes API's schemas and Chaos Mesh's CRDs (and its webhook's rules), and
the default scenario's files equal their golden copies."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from k8s_schemas import (CHAOS_MESH_DIR, chaos_mesh_webhook_problems, crd_problems,
                         crd_validators, k8s_problems)

from testbed import cli
from testbed.errors import PlanError
from testbed.export.build import (DEFAULT_DC_NODE_LABEL, DEFAULT_IMAGE, ExportOptions,
                                  build_export, namespace_name)
from testbed.export.write import export_summary, write_export
from testbed.pdd.run.config import parse_config
from testbed.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
# every shipped scenario but those whose faults start on a protocol event (no Chaos Mesh
# translation: test_a_fault_on_an_event_is_refused_with_the_reason)
SCENARIOS = sorted(p for p in (ROOT / "scenarios").glob("*.yaml")
                   if not any(f.trigger for f in load_scenario(p).faults))
GOLDEN = Path(__file__).parent / "golden" / "k8s-quickstart"
CHAOS_KINDS = ("NetworkChaos", "PodChaos", "Workflow")
needs_crds = pytest.mark.skipif(not CHAOS_MESH_DIR.is_dir(),
                                reason=f"Chaos Mesh CRD schemas not at {CHAOS_MESH_DIR}")


@pytest.fixture(scope="module")
def validators():
    return crd_validators()


def _written(path: Path, tmp_path: Path, opts=ExportOptions()) -> list[dict]:
    sc = load_scenario(path)
    write_export(build_export(sc, opts), tmp_path, {"scenario": sc.name})
    return [doc for f in sorted(tmp_path.glob("*/*.yaml"))
            for doc in yaml.safe_load_all(f.read_text())]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_core_object_validates_against_the_kubernetes_schemas(path, tmp_path):
    objs = [o for o in _written(path, tmp_path) if o["kind"] not in CHAOS_KINDS]
    assert {o["kind"] for o in objs} >= {"Namespace", "ConfigMap", "Deployment", "Service",
                                         "Job", "PersistentVolumeClaim"}
    assert [p for o in objs for p in k8s_problems(o)] == []


@needs_crds
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_chaos_object_validates_against_chaos_mesh_crds(path, tmp_path, validators):
    objs = [o for o in _written(path, tmp_path) if o["kind"] in CHAOS_KINDS]
    assert objs and all(o["kind"] == "Workflow" for o in objs)
    problems = [p for o in objs for p in crd_problems(o, validators)
                + chaos_mesh_webhook_problems(o)]
    assert problems == []


def test_a_fault_on_an_event_is_refused_with_the_reason():
    sc = load_scenario(ROOT / "scenarios" / "event-faults.yaml")
    with pytest.raises(PlanError, match=r"fault 0 \(restart\) starts on handoff_sent #4: a "
                                        "protocol event of the roles has no Chaos Mesh"):
        build_export(sc)


def test_the_validators_reject_what_the_api_server_or_chaos_mesh_would(validators):
    sc = load_scenario(ROOT / "scenarios" / "kill-md-restart.yaml")
    files = dict(build_export(sc).modes[0].files)
    deploy = copy.deepcopy(files["20-roles.yaml"][0])
    deploy["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"  # typo
    assert k8s_problems(deploy)
    wf = copy.deepcopy(files["50-workflow.yaml"][0])
    wan = next(t for t in wf["spec"]["templates"] if t["name"] == "wan-0")
    wan["networkChaos"]["rate"]["rate"] = "1.5gbit"           # the webhook wants an integer
    wan["networkChaos"]["duration"] = "10s"                   # not inside a workflow
    problems = chaos_mesh_webhook_problems(wf)
    assert any("1.5gbit" in p for p in problems) and any("duration" in p for p in problems)
    if validators:
        wan["networkChaos"]["delay"]["limit"] = 100           # NetworkChaos has no netem limit
        wan["networkChaos"]["direction"] = "sideways"
        crd = " ".join(crd_problems(wf, validators))
        assert "'limit' was unexpected" in crd and "sideways" in crd


def test_quickstart_files_equal_the_golden_copies(tmp_path, request):
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    exp = build_export(sc)
    write_export(exp, tmp_path, {"scenario": sc.name})
    got = {str(p.relative_to(tmp_path)): p.read_text() for p in sorted(tmp_path.rglob("*"))
           if p.is_file() and p.name != "metadata.json"}  # metadata.json: time and revision
    if request.config.getoption("--update-golden"):
        for rel, text in got.items():
            (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / rel).write_text(text)
    want = {str(p.relative_to(GOLDEN)): p.read_text() for p in sorted(GOLDEN.rglob("*"))
            if p.is_file()}
    assert sorted(got) == sorted(want), "files changed; review and --update-golden"
    for rel in got:
        assert got[rel] == want[rel], f"{rel} changed; review and --update-golden"


def test_the_exported_cluster_config_names_services_and_keeps_the_scenario_settings():
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    mode = build_export(sc).modes[0]
    cm = dict(mode.files)["10-config.yaml"][0]
    cfg = parse_config(json.loads(cm["data"]["cluster.json"]), "cluster.json")
    ns = namespace_name("quickstart", "pdd")
    assert {i.name: i.host for i in cfg.instances} == {
        n: f"{n}.{ns}.svc.cluster.local" for n in ("p1", "rld1", "router", "client", "md1")}
    assert cfg.timing.kv_scale_k == 1.0 and cfg.timing.token_scale == 32
    assert cfg.router.wan_prior_gbit == 10 and cfg.router.wan_rtt_s == 0.04
    services = {o["metadata"]["name"]: o for f, objs in mode.files for o in objs
                if o["kind"] == "Service"}
    assert set(services) == {i.name for i in cfg.instances}
    assert all(s["spec"]["clusterIP"] == "None" for s in services.values())  # pod IPs


def test_pods_are_placed_and_labelled_by_datacenter():
    sc = load_scenario(ROOT / "scenarios" / "congestion.yaml")
    opts = ExportOptions(dc_node_label="example.com/dc", accelerator="nvidia.com/gpu")
    mode = build_export(sc, opts).modes[0]
    pods = {o["metadata"]["name"]: o["spec"]["template"] for _, objs in mode.files for o in objs
            if o["kind"] in ("Deployment", "Job")}
    dc = {n: t["metadata"]["labels"]["pdd-testbed/dc"] for n, t in pods.items()}
    assert dc == {"p1": "a", "rld1": "a", "router": "a", "md1": "b", "client": "a",
                  "xb1-f0": "b", "xa1-f0": "a"}  # congestion a>b: sender in A, server in B
    for name, t in pods.items():
        term = t["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        assert term["matchExpressions"] == [{"key": "example.com/dc", "operator": "In",
                                             "values": [dc[name]]}]
    md = pods["md1"]
    assert md["metadata"]["annotations"]["pdd-testbed/chip"] == "GPU-B"
    assert pods["p1"]["metadata"]["annotations"]["pdd-testbed/chip"] == "GPU-A"
    assert md["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert "limits" not in pods["router"]["spec"]["containers"][0]["resources"]
    # only args: pod-failure swaps the image for pause, which could not run a command
    assert all("command" not in c and c["args"] for t in pods.values()
               for c in t["spec"]["containers"])
    assert pods["md1"]["spec"]["containers"][0]["args"][:1] == ["role"]


def test_export_json_lists_modes_files_and_notes():
    sc = load_scenario(ROOT / "scenarios" / "loss.yaml")
    out = export_summary(build_export(sc))
    assert [m["namespace"] for m in out["modes"]] == [
        "tb-loss-pdd", "tb-loss-cross-dc-pd", "tb-loss-same-dc-pd"]
    assert any("Gilbert-Elliott" in n for n in out["notes"])
    assert out["wan_bdp_bytes"] == 50_000_000  # 10 Gbit/s x 40 ms


def test_a_fault_on_another_link_is_a_plan_error(tmp_path):
    text = (ROOT / "scenarios" / "quickstart.yaml").read_text().replace(
        "expectations:", "faults:\n  - {at_s: 1, kind: bandwidth, rate_gbit: 1, link: host:p1}\n"
        "expectations:", 1)
    path = ROOT / "scenarios" / "quickstart.yaml"
    (tmp_path / "s.yaml").write_text(text.replace("../topologies", str(path.parent.parent /
                                                                      "topologies")))
    with pytest.raises(PlanError, match="only the WAN"):
        build_export(load_scenario(tmp_path / "s.yaml"))


def test_cli_defaults_match_the_exporter():
    p = cli.build_parser().parse_args(["export", "k8s", "x.yaml", "--out", "d"])
    assert (p.image, p.dc_node_label) == (DEFAULT_IMAGE, DEFAULT_DC_NODE_LABEL)


def test_cli_export_writes_the_folders_and_bad_input_exits_2(tmp_path, capsys):
    assert cli.main(["export", "k8s", str(ROOT / "scenarios" / "kill-rld.yaml"),
                     "--out", str(tmp_path / "k")]) == 0
    out = capsys.readouterr().out
    assert "kubectl apply --server-side -f" in out and "tb-kill-rld-pdd" in out
    assert sorted(p.name for p in (tmp_path / "k" / "pdd").iterdir()) == [
        "00-namespace.yaml", "10-config.yaml", "20-roles.yaml", "40-client.yaml",
        "50-workflow.yaml"]
    assert cli.main(["export", "k8s", str(ROOT / "topologies" / "two-dc.yaml"),
                     "--out", str(tmp_path / "bad")]) == 2
    assert "invalid input" in capsys.readouterr().err
    assert cli.main(["collect", str(tmp_path / "k"), "--out", str(tmp_path / "run")]) == 2
    assert "kubectl cp" in capsys.readouterr().err
