"""Kubernetes core objects of one exported mode: plain dicts, no I/O.

Owns the naming and labelling of what runs in the cluster. Per mode, in
namespace ``tb-{scenario}-{mode}`` (a DNS-1123 label of at most 63 chars):

- ConfigMap ``testbed-config``: ``cluster.json`` (every instance at its
  Service's DNS name ``{instance}.{namespace}.svc.{cluster_domain}``) and
  ``workload.jsonl``;
- per role instance (P, RLD, MD, router): a Deployment (1 replica,
  ``Recreate``) and a headless Service of the same name. Headless, with
  ``publishNotReadyAddresses``, so the name resolves to the pod's own IP:
  the role binds to it, and Chaos Mesh's ipset filters (pod IPs) match
  the traffic, which a ClusterIP would hide behind kube-proxy's NAT;
- the client: a Job (no retries) writing to the PVC ``results``, and a
  headless Service for its control port (``/ready``, ``/start``);
- per ``congestion`` fault: an iperf3 server Deployment in the receiving
  DC's cross-traffic host and an iperf3 client Job in the sending DC's,
  started by the Workflow through that pod's trigger port (``inpod trigger``).

Every pod carries ``pdd-testbed/dc`` (the topology's datacenter name),
``pdd-testbed/role`` and ``pdd-testbed/instance``, and is placed by a
required node affinity on nodes labelled ``{dc_node_label}={dc}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from testbed.export.chaos import CLIENT_PORT, DC_LABEL, INSTANCE_LABEL, TRIGGER_PORT
from testbed.export.inpod import HEALTH_PORT
from testbed.pdd.run.config import TimingConfig
from testbed.pdd.wire.fields import Role

CONFIG_DIR = "/etc/testbed"
RESULTS_DIR = "/results"
IPERF_PORT = 5201
ROLE_LABEL = "pdd-testbed/role"
MODE_LABEL = "pdd-testbed/mode"
CONFIGMAP_MAX_BYTES = 1_000_000  # the API server stores at most 1 MiB per object
ROLE_CPU, ROLE_MEMORY = "1", "2Gi"  # the tiny model on CPU; torch needs ~1 GiB
IMAGE_UID = 10001  # the Containerfile's user; fsGroup makes /results writable for it


@dataclass(frozen=True)
class PodPlan:
    """What one exported pod needs: the export's options, resolved."""

    namespace: str
    image: str
    dc_node_label: str
    accelerator: str | None       # extended resource name, e.g. nvidia.com/gpu
    mode: str


def meta(name: str, plan: PodPlan, labels: dict | None = None) -> dict:
    return {"name": name, "namespace": plan.namespace,
            "labels": {"app.kubernetes.io/part-of": "testbed", MODE_LABEL: plan.mode,
                       **(labels or {})}}


def pod_labels(dc: str, role: str, instance: str) -> dict:
    return {DC_LABEL: dc, ROLE_LABEL: role, INSTANCE_LABEL: instance}


def _affinity(plan: PodPlan, dc: str) -> dict:
    term = {"matchExpressions": [{"key": plan.dc_node_label, "operator": "In", "values": [dc]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                             {"nodeSelectorTerms": [term]}}}


def _config_volume() -> dict:
    return {"name": "config", "configMap": {"name": "testbed-config"}}


def _container(plan: PodPlan, name: str, args: list[str], resources: dict,
               ports: list[int] = (), mounts: list[dict] = ()) -> dict:
    """A container of the testbed image. Only ``args``: the image's ENTRYPOINT is
    ``python -m testbed.export.inpod``. A ``command`` would break Chaos Mesh's
    pod-failure, which swaps the image for ``pause``: pause cannot run our command,
    the container crash-loops, and the back-off delays its restart after recovery."""
    c = {"name": name, "image": plan.image, "imagePullPolicy": "IfNotPresent",
         "args": args, "resources": resources}
    if ports:
        c["ports"] = [{"containerPort": p, "protocol": "TCP"} for p in ports]
    if mounts:
        c["volumeMounts"] = list(mounts)
    return c


def _pod_spec(plan: PodPlan, dc: str, containers: list[dict], volumes: list[dict],
              restart: str = "Always") -> dict:
    return {"affinity": _affinity(plan, dc), "restartPolicy": restart,
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": True, "runAsUser": IMAGE_UID,
                                "fsGroup": IMAGE_UID},
            "containers": containers, "volumes": volumes}


def namespace(plan: PodPlan) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": plan.namespace,
                         "labels": {"app.kubernetes.io/part-of": "testbed",
                                    MODE_LABEL: plan.mode}}}


def config_map(plan: PodPlan, cluster: dict, workload_jsonl: str) -> dict:
    from testbed.errors import PlanError

    data = {"cluster.json": json.dumps(cluster, indent=1) + "\n",
            "workload.jsonl": workload_jsonl}
    size = sum(len(v.encode()) for v in data.values())
    if size > CONFIGMAP_MAX_BYTES:
        raise PlanError(f"ConfigMap testbed-config would hold {size} bytes (cluster config "
                        f"and workload), over Kubernetes' {CONFIGMAP_MAX_BYTES}")
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("testbed-config", plan),
            "data": data}


def headless_service(plan: PodPlan, name: str, labels: dict, port: int) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, plan, labels),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {INSTANCE_LABEL: labels[INSTANCE_LABEL]},
                     "ports": [{"name": "tcp", "port": port, "targetPort": port,
                                "protocol": "TCP"}]}}


def _role_resources(plan: PodPlan, role: Role) -> tuple[dict, dict]:
    """Requests for a role's pod and its chip annotation (the cost model's chip)."""
    timing = TimingConfig()
    req = {"cpu": ROLE_CPU, "memory": ROLE_MEMORY}
    res = {"requests": req}
    notes = {}
    if role in (Role.PREFILL, Role.RELAY_DECODE, Role.MAIN_DECODE):
        chip = timing.cost(role).chip
        notes = {"pdd-testbed/chip": chip.name, "pdd-testbed/chips": str(timing.n_chips)}
        if plan.accelerator:
            res = {"requests": {**req, plan.accelerator: str(timing.n_chips)},
                   "limits": {plan.accelerator: str(timing.n_chips)}}
    return res, notes


def role_deployment(plan: PodPlan, inst: dict, dc: str) -> dict:
    """The Deployment of one server role instance (``inst``: a cluster.json instance)."""
    name, role = inst["name"], Role[inst["role"].upper()]
    labels = pod_labels(dc, inst["role"], name)
    resources, chip = _role_resources(plan, role)
    c = _container(plan, "role", ["role", f"{CONFIG_DIR}/cluster.json", name], resources,
                   [inst["port"], HEALTH_PORT], [{"name": "config", "mountPath": CONFIG_DIR}])
    # ready = the role printed "ready" (the router: connected to every P, RLD and MD)
    c["readinessProbe"] = {"httpGet": {"path": "/ready", "port": HEALTH_PORT},
                           "periodSeconds": 2}
    template = {"metadata": {"labels": {**labels, MODE_LABEL: plan.mode}, "annotations": chip},
                "spec": _pod_spec(plan, dc, [c], [_config_volume()])}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name, plan, labels),
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                     "selector": {"matchLabels": {INSTANCE_LABEL: name}},
                     "template": template}}


def results_claim(plan: PodPlan) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta("results", plan),
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}}


def _job(plan: PodPlan, name: str, labels: dict, pod_spec: dict) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta(name, plan, labels),
            "spec": {"backoffLimit": 0,
                     "template": {"metadata": {"labels": {**labels, MODE_LABEL: plan.mode}},
                                  "spec": pod_spec}}}


def client_job(plan: PodPlan, inst: dict, dc: str, linger_s: int) -> dict:
    """The client: waits for the roles, runs the warm-up, answers ``/ready``, replays
    the measured workload on ``POST /start``, writes ``/results``, lingers for copying."""
    name = inst["name"]
    labels = pod_labels(dc, "client", name)
    cmd = ["client", f"{CONFIG_DIR}/cluster.json", name,
           "--workload", f"{CONFIG_DIR}/workload.jsonl", "--results", RESULTS_DIR,
           "--port", str(CLIENT_PORT), "--linger-s", str(linger_s)]
    c = _container(plan, "client", cmd, {"requests": {"cpu": ROLE_CPU, "memory": ROLE_MEMORY}},
                   [CLIENT_PORT], [{"name": "config", "mountPath": CONFIG_DIR},
                                   {"name": "results", "mountPath": RESULTS_DIR}])
    vols = [_config_volume(), {"name": "results",
                               "persistentVolumeClaim": {"claimName": "results"}}]
    return _job(plan, name, labels, _pod_spec(plan, dc, [c], vols, restart="Never"))


def iperf_server(plan: PodPlan, name: str, dc: str) -> dict:
    labels = pod_labels(dc, "cross_traffic", name)
    c = _container(plan, "iperf3", ["exec", "--", "iperf3", "-s", "-p", str(IPERF_PORT)],
                   {"requests": {"cpu": "500m", "memory": "128Mi"}}, [IPERF_PORT])
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name, plan, labels),
            "spec": {"replicas": 1, "selector": {"matchLabels": {INSTANCE_LABEL: name}},
                     "template": {"metadata": {"labels": {**labels, MODE_LABEL: plan.mode}},
                                  "spec": _pod_spec(plan, dc, [c], [])}}}


def iperf_client(plan: PodPlan, name: str, dc: str, server_dns: str, flows: int,
                 duration_s: float) -> dict:
    """An iperf3 client (the sender) that waits for ``POST /start`` on the trigger port."""
    labels = pod_labels(dc, "cross_traffic", name)
    cmd = ["trigger", "--port", str(TRIGGER_PORT), "--",
           "iperf3", "-c", server_dns, "-p", str(IPERF_PORT), "-P", str(flows),
           "-t", str(max(1, round(duration_s)))]
    c = _container(plan, "iperf3", cmd, {"requests": {"cpu": "500m", "memory": "256Mi"}},
                   [TRIGGER_PORT])
    return _job(plan, name, labels, _pod_spec(plan, dc, [c], [], restart="Never"))
