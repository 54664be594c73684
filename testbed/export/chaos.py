"""Chaos Mesh objects of one exported mode: the WAN's NetworkChaos specs and the Workflow.

Owns the translation of a ``Timeline`` (testbed.export.timeline) into one
Workflow (chaos-mesh.org/v1alpha1). Its entry is a Serial of:

1. ``wait-ready``: a StatusCheck polling the client pod's ``GET /ready``
   (200 once every role accepts connections and the warm-up is done);
2. ``timeline``: a Parallel of branches that all start together:
   - ``wan``: a Serial of one NetworkChaos per WAN segment (action
     ``netem``: delay, jitter, loss, duplication and netem's ``rate`` in ONE qdisc,
     direction ``both`` between the DC A and DC B pods; an asymmetric
     segment is two NetworkChaos with direction ``to``, one per DC's
     egress), each with ``deadline`` = the segment's length. One object
     at a time: two NetworkChaos on the same pods do not add up;
   - ``start``: a Suspend of ``settle_s`` (the first NetworkChaos is
     injected meanwhile), then a StatusCheck ``POST /start`` to the
     client, which answers 200 and starts the measured replay: the
     workload's t = 0 is ``settle_s`` into the timeline;
   - one branch per fault step: a Suspend of ``settle_s + at_s``, then a
     partition NetworkChaos, a PodChaos ``pod-failure`` or a StatusCheck
     ``POST /start`` to an iperf3 client pod, with its deadline.

Pods are selected by label (``pdd-testbed/dc``, ``pdd-testbed/instance``) in
the mode's namespace, Running pods only; the WAN selects every pod of a DC
(roles, client, iperf3). Chaos Mesh resolves selectors when it injects, so
the WAN segments are injected after ``wait-ready``, when the pods run.
Names follow DNS-1123 and are unique, as Chaos Mesh's webhook requires.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.export.timeline import Direction, Step, Timeline, WanSegment
from testbed.export.units import delay_string, pct_string, rate_string, seconds_string

API = "chaos-mesh.org/v1alpha1"
DC_LABEL = "pdd-testbed/dc"
INSTANCE_LABEL = "pdd-testbed/instance"
CLIENT_PORT = 8080
TRIGGER_PORT = 8081
READY_WAIT_S = 3600  # how long wait-ready polls (1 s apart) before the workflow fails


@dataclass(frozen=True)
class ChaosContext:
    """What the Chaos Mesh objects need to know about the exported mode."""

    namespace: str
    dc_a: str                    # the topology's datacenter names (label values)
    dc_b: str
    client_url: str              # http://client-svc...:8080
    trigger_urls: dict           # fault index -> http://...:8081 (iperf3 client pods)
    settle_s: float = 5.0


def _selector(ctx: ChaosContext, labels: dict) -> dict:
    return {"namespaces": [ctx.namespace], "labelSelectors": dict(labels),
            "podPhaseSelectors": ["Running"]}


def netem_spec(ctx: ChaosContext, d: Direction, src_dc: str, dst_dc: str,
               direction: str) -> dict:
    """A NetworkChaos spec: netem (delay, jitter, loss, duplication, rate) on the egress of
    ``src_dc``'s pods toward ``dst_dc``'s (``direction`` ``to``), or on both
    sides' egress toward each other (``both``)."""
    spec = {"action": "netem", "mode": "all",
            "selector": _selector(ctx, {DC_LABEL: src_dc}),
            "direction": direction,
            "target": {"mode": "all", "selector": _selector(ctx, {DC_LABEL: dst_dc})},
            "rate": {"rate": rate_string(d.rate_gbit)}}
    if d.delay_ms > 0:
        spec["delay"] = {"latency": delay_string(d.delay_ms), "correlation": "0",
                         "jitter": delay_string(d.jitter_ms)}
    if d.loss_pct > 0:
        spec["loss"] = {"loss": pct_string(d.loss_pct), "correlation": "0"}
    if d.duplicate_pct > 0:
        spec["duplicate"] = {"duplicate": pct_string(d.duplicate_pct), "correlation": "0"}
    return spec


def partition_spec(ctx: ChaosContext) -> dict:
    return {"action": "partition", "mode": "all", "direction": "both",
            "selector": _selector(ctx, {DC_LABEL: ctx.dc_a}),
            "target": {"mode": "all", "selector": _selector(ctx, {DC_LABEL: ctx.dc_b})}}


def pod_failure_spec(ctx: ChaosContext, instance: str) -> dict:
    return {"action": "pod-failure", "mode": "all",
            "selector": _selector(ctx, {INSTANCE_LABEL: instance})}


def _status_check(name: str, url: str, method: str, tries: int) -> dict:
    return {"name": name, "templateType": "StatusCheck",
            "statusCheck": {"mode": "Synchronous", "type": "HTTP",
                            "http": {"url": url, "method": method,
                                     "criteria": {"statusCode": "200"}},
                            "intervalSeconds": 1, "timeoutSeconds": 1,
                            "successThreshold": 1, "failureThreshold": tries,
                            "duration": seconds_string(tries + 10)}}


def _suspend(name: str, seconds: float) -> dict:
    return {"name": name, "templateType": "Suspend", "deadline": seconds_string(seconds)}


def _wan_templates(ctx: ChaosContext, i: int, seg: WanSegment, length_s: float) -> list[dict]:
    """The templates of WAN segment ``i``; the first is the one the chain lists."""
    name, deadline = f"wan-{i}", seconds_string(length_s)
    if seg.symmetric:
        return [{"name": name, "templateType": "NetworkChaos", "deadline": deadline,
                 "networkChaos": netem_spec(ctx, seg.a_to_b, ctx.dc_a, ctx.dc_b, "both")}]
    halves = [{"name": f"{name}-ab", "templateType": "NetworkChaos", "deadline": deadline,
               "networkChaos": netem_spec(ctx, seg.a_to_b, ctx.dc_a, ctx.dc_b, "to")},
              {"name": f"{name}-ba", "templateType": "NetworkChaos", "deadline": deadline,
               "networkChaos": netem_spec(ctx, seg.b_to_a, ctx.dc_b, ctx.dc_a, "to")}]
    return [{"name": name, "templateType": "Parallel", "deadline": deadline,
             "children": [h["name"] for h in halves]}] + halves


def _step_template(ctx: ChaosContext, step: Step) -> dict:
    name = f"f{step.fault_index}-{step.action}"
    deadline = seconds_string(step.duration_s)
    if step.action == "partition":
        return {"name": name, "templateType": "NetworkChaos", "deadline": deadline,
                "networkChaos": partition_spec(ctx)}
    if step.action == "pod-failure":
        return {"name": name, "templateType": "PodChaos", "deadline": deadline,
                "podChaos": pod_failure_spec(ctx, step.target)}
    return _status_check(name, ctx.trigger_urls[step.fault_index] + "/start", "POST", 30)


def workflow(ctx: ChaosContext, tl: Timeline, name: str) -> dict:
    """The Workflow object of one mode (see the module docstring)."""
    templates = [{"name": "run", "templateType": "Serial",
                  "children": ["wait-ready", "timeline"]},
                 _status_check("wait-ready", ctx.client_url + "/ready", "GET", READY_WAIT_S)]
    branches = ["wan", "start"]
    wan_children = []
    for i, seg in enumerate(tl.wan):
        length = seg.end_s - seg.start_s + (ctx.settle_s if i == 0 else 0.0)
        made = _wan_templates(ctx, i, seg, length)
        wan_children.append(made[0]["name"])
        templates += made
    templates += [{"name": "wan", "templateType": "Serial", "children": wan_children},
                  {"name": "start", "templateType": "Serial",
                   "children": ["settle", "start-client"]},
                  _suspend("settle", ctx.settle_s),
                  _status_check("start-client", ctx.client_url + "/start", "POST", 30)]
    for step in tl.steps:
        act = _step_template(ctx, step)
        branch = f"f{step.fault_index}"
        templates += [{"name": branch, "templateType": "Serial",
                       "children": [f"{branch}-wait", act["name"]]},
                      _suspend(f"{branch}-wait", ctx.settle_s + step.at_s), act]
        branches.append(branch)
    templates.insert(2, {"name": "timeline", "templateType": "Parallel", "children": branches})
    return {"apiVersion": API, "kind": "Workflow",
            "metadata": {"name": name, "namespace": ctx.namespace},
            "spec": {"entry": "run", "templates": templates}}
