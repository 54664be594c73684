"""Validators for exported manifests: the Kubernetes API's schemas and Chaos Mesh's CRDs.

- Core kinds (Namespace, ConfigMap, Service, Deployment, Job, PVC):
  ``kubernetes_validate`` in strict mode (unknown fields are errors).
- NetworkChaos, PodChaos, Workflow: the ``openAPIV3Schema`` of Chaos Mesh's
  released CRDs, from ``../shared/schemas/chaos-mesh/`` next to the
  repository (``CHAOS_MESH_DIR``; tests skip when it is absent), made strict:
  every object schema with ``properties`` and no ``additionalProperties`` /
  ``x-kubernetes-preserve-unknown-fields`` rejects unknown keys, since the
  API server would silently prune them.
- ``chaos_mesh_webhook_problems``: the admission webhook's rules that the
  CRD schema does not carry, as Chaos Mesh's source states them (commit
  608b61e, ``api/v1alpha1/workflow_webhook.go`` and
  ``networkchaos_webhook.go``): template names DNS-1123 and unique, the
  entry and every child exist, a Suspend has a deadline, chaos inside a
  workflow has no ``duration``, ``rate`` is an unsigned integer and a
  ``...bit``/``...bps`` unit, ``direction: from|both`` needs a target.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHAOS_MESH_DIR = ROOT.parent / "shared" / "schemas" / "chaos-mesh"
CRD_FILES = {"NetworkChaos": "networkchaos.crd.yaml", "PodChaos": "podchaos.crd.yaml",
             "Workflow": "workflows.crd.yaml"}
K8S_VERSION = "1.37.0"
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
RATE_RE = re.compile(r"^[0-9]+(kbit|mbit|gbit|tbit|tbps|gbps|mbps|kbps|bps|bit)$")
CHAOS_TEMPLATE_KEYS = {"NetworkChaos": "networkChaos", "PodChaos": "podChaos"}


def _strict(schema: dict) -> dict:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def crd_validators() -> dict:
    """kind -> jsonschema validator of its CRD (strict), or {} without the folder."""
    if not CHAOS_MESH_DIR.is_dir():
        return {}
    out = {}
    for kind, name in CRD_FILES.items():
        crd = yaml.safe_load((CHAOS_MESH_DIR / name).read_text())
        schema = _strict(copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
        out[kind] = jsonschema.Draft7Validator(schema)
    return out


def k8s_problems(obj: dict) -> list[str]:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}"]
    return []


def crd_problems(obj: dict, validators: dict) -> list[str]:
    v = validators[obj["kind"]]
    return [f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.absolute_path)}"
            for e in v.iter_errors(obj)]


def _network_chaos_problems(spec: dict, where: str) -> list[str]:
    out = []
    for key in ("rate", "bandwidth"):
        if key in spec and not RATE_RE.match(spec[key]["rate"].strip().lower()):
            out.append(f"{where}: {key}.rate {spec[key]['rate']!r} is not an integer and a unit")
    if spec.get("direction") in ("from", "both") and "target" not in spec:
        out.append(f"{where}: direction {spec['direction']} needs a target")
    return out


def chaos_mesh_webhook_problems(obj: dict) -> list[str]:
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "NetworkChaos":
        return _network_chaos_problems(obj["spec"], f"NetworkChaos/{name}")
    if kind != "Workflow":
        return []
    spec, out = obj["spec"], []
    names = [t["name"] for t in spec["templates"]]
    if len(set(names)) != len(names):
        out.append(f"Workflow/{name}: duplicate template names")
    if spec["entry"] not in names:
        out.append(f"Workflow/{name}: entry {spec['entry']!r} is no template")
    for t in spec["templates"]:
        where, ttype = f"Workflow/{name} template {t['name']}", t["templateType"]
        if not DNS1123_SUBDOMAIN.match(t["name"]) or len(t["name"]) > 253:
            out.append(f"{where}: name is not a DNS-1123 subdomain")
        if ttype == "Suspend" and not t.get("deadline"):
            out.append(f"{where}: Suspend without deadline")
        if ttype in ("Serial", "Parallel"):
            out += [f"{where}: child {c!r} is no template" for c in t["children"]
                    if c not in names]
        elif "children" in t:
            out.append(f"{where}: {ttype} with children")
        if ttype in CHAOS_TEMPLATE_KEYS:
            embedded = t.get(CHAOS_TEMPLATE_KEYS[ttype])
            if embedded is None:
                out.append(f"{where}: {ttype} without its spec")
            else:
                if "duration" in embedded:
                    out.append(f"{where}: duration inside a workflow (use deadline)")
                if ttype == "NetworkChaos":
                    out += _network_chaos_problems(embedded, where)
        elif ttype not in ("Serial", "Parallel", "Suspend", "StatusCheck", "Task", "Schedule"):
            out.append(f"{where}: unknown templateType {ttype!r}")
    return out
