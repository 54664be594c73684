"""A scenario as Kubernetes + Chaos Mesh objects: ``build_export``, pure (no I/O but
reading the scenario's workload trace).

Owns the assembly of one ``ModeExport`` per mode: the manifests of
``testbed.export.manifests`` and the Workflow of ``testbed.export.chaos``,
grouped into the files ``kubectl apply`` reads in name order, plus the
notes of everything that is approximated. The modes are separate
namespaces and are meant to run one after another, as on one machine.
Rates are nominal (k = 1): the roles' KV payloads are full size.

Example::

    exp = build_export(load_scenario("scenarios/quickstart.yaml"), ExportOptions())
    [m.namespace for m in exp.modes]       # ['tb-quickstart-pdd', 'tb-quickstart-cross-dc-pd']
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import PlanError, SpecError
from testbed.types import is_file_policy
from testbed.export import chaos, manifests
from testbed.export.timeline import Timeline, translate
from testbed.linkmath import GSO_MAX_BYTES, MTU_BYTES, bdp_bytes
from testbed.scenario.cluster_config import cluster_dict_for, workload_lines
from testbed.spec.scenario import ModeRun, Scenario
from testbed.spec.topology import Role as TopoRole

DEFAULT_IMAGE = "localhost/pdd-testbed:0.1.0"
DEFAULT_DC_NODE_LABEL = "pdd-testbed/datacenter"
NETEM_DEFAULT_LIMIT_PKTS = 1000  # netem's queue when nothing sets "limit"
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class ExportOptions:
    image: str = DEFAULT_IMAGE
    dc_node_label: str = DEFAULT_DC_NODE_LABEL
    accelerator: str | None = None      # an extended resource (nvidia.com/gpu) per chip
    cluster_domain: str = "cluster.local"
    settle_s: float = 5.0               # WAN injected this long before the workload starts
    linger_s: int = 3600                # the client pod stays this long for kubectl cp


@dataclass(frozen=True)
class ModeExport:
    name: str                  # the mode's run folder name
    namespace: str
    files: tuple[tuple[str, tuple[dict, ...]], ...]   # (file name, objects), apply order
    timeline: Timeline
    cluster: dict              # cluster.json as the pods read it


@dataclass(frozen=True)
class Export:
    scenario: str
    modes: tuple[ModeExport, ...]
    notes: tuple[str, ...]
    wan_bdp_bytes: int


def namespace_name(scenario: str, mode: str) -> str:
    """``tb-{scenario}-{mode}``, lowercase, at most 63 characters (a DNS-1123 label)."""
    name = _DNS_LABEL.sub("-", f"tb-{scenario}-{mode}".lower()).strip("-")[:63]
    return name.rstrip("-")


def _dns(opts: ExportOptions, ns: str, service: str) -> str:
    return f"{service}.{ns}.svc.{opts.cluster_domain}"


def _cross_hosts(sc: Scenario) -> dict[str, str]:
    """DC name -> its first cross-traffic host."""
    out: dict[str, str] = {}
    for h in sc.topology.hosts_with(TopoRole.CROSS_TRAFFIC):
        out.setdefault(h.dc, h.name)
    return out


def _cross_traffic(sc: Scenario, tl: Timeline, plan, opts, dcs) -> tuple[list[dict], dict]:
    hosts, objs, urls = _cross_hosts(sc), [], {}
    for step in (s for s in tl.steps if s.action == "cross-traffic"):
        src, dst = (dcs[0], dcs[1]) if step.target == "a>b" else (dcs[1], dcs[0])
        if src not in hosts or dst not in hosts:
            raise PlanError(f"fault {step.fault_index} (congestion): needs a cross_traffic "
                            f"host in datacenters {src} and {dst}; the topology has "
                            f"{sorted(hosts) or 'none'}")
        server, client = f"{hosts[dst]}-f{step.fault_index}", f"{hosts[src]}-f{step.fault_index}"
        objs += [manifests.iperf_server(plan, server, dst),
                 manifests.headless_service(plan, server, manifests.pod_labels(
                     dst, "cross_traffic", server), manifests.IPERF_PORT),
                 manifests.iperf_client(plan, client, src, _dns(opts, plan.namespace, server),
                                        step.flows, step.duration_s),
                 manifests.headless_service(plan, client, manifests.pod_labels(
                     src, "cross_traffic", client), chaos.TRIGGER_PORT)]
        urls[step.fault_index] = f"http://{_dns(opts, plan.namespace, client)}:{chaos.TRIGGER_PORT}"
    return objs, urls


def build_mode(sc: Scenario, mode: ModeRun, opts: ExportOptions) -> ModeExport:
    """Every object of one mode (see the module docstring)."""
    from testbed.workload import build_workload

    ns = namespace_name(sc.name, mode.name)
    plan = manifests.PodPlan(ns, opts.image, opts.dc_node_label, opts.accelerator, mode.name)
    dcs = (sc.topology.datacenters[0].name, sc.topology.datacenters[1].name)
    if is_file_policy(mode.policy):  # a user's policy file: the image does not carry it
        raise SpecError(sc.file, f"modes[{sc.modes.index(mode)}].policy", "a built-in policy "
                        "to export (a policy file is not in the image)", mode.policy)
    cluster = cluster_dict_for(sc.topology, 1.0, mode, {})
    for inst in cluster["instances"]:  # each instance at its own Service (a router host's
        # client is "{host}c", so the address comes from the instance, not the host)
        inst["host"] = _dns(opts, ns, inst["name"])
    workload = build_workload(mode.workload, Path(sc.file).parent)
    wl_text = "".join(json.dumps(line) + "\n" for line in workload_lines(workload))
    by_role: dict[str, list[str]] = {}
    for inst in cluster["instances"]:
        by_role.setdefault(inst["role"], []).append(inst["name"])
    horizon = workload.stats.span_s + sc.drain_s + sc.pdd.request_timeout_s
    tl = translate(sc.faults, sc.topology.wan, by_role, horizon)
    dc_of = {i["name"]: dcs[0] if i["dc"] == "A" else dcs[1] for i in cluster["instances"]}
    roles, client = [], []
    for inst in cluster["instances"]:
        labels = manifests.pod_labels(dc_of[inst["name"]], inst["role"], inst["name"])
        if inst["role"] == "client":
            client += [manifests.results_claim(plan),
                       manifests.headless_service(plan, inst["name"], labels, chaos.CLIENT_PORT),
                       manifests.client_job(plan, inst, dc_of[inst["name"]], opts.linger_s)]
        else:
            roles += [manifests.role_deployment(plan, inst, dc_of[inst["name"]]),
                      manifests.headless_service(plan, inst["name"], labels, inst["port"])]
    cross, urls = _cross_traffic(sc, tl, plan, opts, dcs)
    client_name = next(i["name"] for i in cluster["instances"] if i["role"] == "client")
    ctx = chaos.ChaosContext(ns, dcs[0], dcs[1],
                             f"http://{_dns(opts, ns, client_name)}:{chaos.CLIENT_PORT}", urls,
                             opts.settle_s)
    files = [("00-namespace.yaml", (manifests.namespace(plan),)),
             ("10-config.yaml", (manifests.config_map(plan, cluster, wl_text),)),
             ("20-roles.yaml", tuple(roles))]
    if cross:
        files.append(("30-cross-traffic.yaml", tuple(cross)))
    files += [("40-client.yaml", tuple(client)),
              ("50-workflow.yaml", (chaos.workflow(ctx, tl, "timeline"),))]
    return ModeExport(mode.name, ns, tuple(files), tl, cluster)


def _queue_notes(wan) -> list[str]:
    """What netem's default queue (1000 packets; NetworkChaos cannot set it) holds against
    what one WAN direction has in flight (rate x one-way delay)."""
    out = []
    for what, d in (("a>b", wan.a_to_b), ("b>a", wan.b_to_a)):
        in_flight = round(bdp_bytes(d.rate_gbit * 1e9, d.delay_ms))
        mtu, gso = -(-in_flight // MTU_BYTES), -(-in_flight // GSO_MAX_BYTES)
        if mtu <= NETEM_DEFAULT_LIMIT_PKTS:
            continue
        enough = "not enough even" if gso > NETEM_DEFAULT_LIMIT_PKTS else "enough only"
        out.append(f"netem queue, WAN {what}: {in_flight} bytes in flight (rate x one-way "
                   f"delay) are {mtu} MTU packets or {gso} 64 KB GSO packets; NetworkChaos "
                   f"leaves netem's limit at {NETEM_DEFAULT_LIMIT_PKTS} packets: {enough} "
                   "with GSO/TSO-sized packets")
    return out


def build_export(sc: Scenario, opts: ExportOptions = ExportOptions()) -> Export:
    modes = tuple(build_mode(sc, m, opts) for m in sc.modes)
    wan = sc.topology.wan
    notes = list(dict.fromkeys(n for m in modes for n in m.timeline.notes))
    notes += _queue_notes(wan)
    return Export(sc.name, modes, tuple(notes), wan_bdp_bytes(wan))


def wan_bdp_bytes(wan) -> int:
    """The WAN's bandwidth-delay product (its faster direction x RTT) in whole bytes,
    at least one MTU."""
    rate_bps = max(wan.a_to_b.rate_gbit, wan.b_to_a.rate_gbit) * 1e9
    return max(MTU_BYTES, round(bdp_bytes(rate_bps, wan.rtt_ms)))
