"""The cluster config of one mode as plain data: pure, no network, no processes.

Owns the mapping from a topology's hosts and a mode's role settings to the
JSON that ``testbed.pdd.run.config`` validates and every role process reads:
one instance per role of a host (named after the host; a client that
shares its host with the router gets ``{host}c``), port ``BASE_PORT`` + the
host's index, datacenter ``A`` (the topology's first) or ``B``. Where an
instance is reached is a parameter: the emulated network gives the host's
IP (``testbed.scenario.roles``), a Kubernetes export gives a Service's DNS
name (``testbed.export``).

Example::

    cfg = cluster_dict_for(topo, 25.0, mode_run, {})          # host IPs
    cfg = cluster_dict_for(topo, 1.0, mode_run, {}, address=lambda h: f"{h.name}.ns.svc")
"""

from __future__ import annotations

from typing import Callable

from testbed.spec.topology import HostSpec, Role as TopoRole, Topology
from testbed.pdd.run.config import RUN_MODEL
from testbed.pdd.wire.fields import Role as WireRole

BASE_PORT = 7100
# the topology's roles that run a PDD process (cross_traffic does not): a topology role
# and its process role share one name, "prefill" in the YAML and PREFILL on the wire
PROCESS_ROLES = frozenset(r for r in TopoRole if r.name in WireRole.__members__)


def instance_name(topo: Topology, host: HostSpec, role: TopoRole) -> str:
    """The instance name of ``role`` on ``host`` (see the module docstring)."""
    if role is TopoRole.CLIENT and TopoRole.ROUTER in host.roles:
        return f"{host.name}c"
    return host.name


def cluster_dict_for(topo: Topology, scale: float, mode_run, settings: dict,
                     address: Callable[[HostSpec], str] = lambda h: h.ip) -> dict:
    """The cluster config of ``mode_run`` on ``topo`` at bandwidth scale ``scale``."""
    instances = []
    for i, host in enumerate(topo.hosts):
        for role in host.roles:
            if role in PROCESS_ROLES:
                instances.append({"name": instance_name(topo, host, role),
                                  "role": role.value, "host": address(host),
                                  "port": 0 if role is TopoRole.CLIENT else BASE_PORT + i,
                                  "dc": "A" if host.dc == topo.datacenters[0].name else "B"})
    pdd = mode_run.pdd
    return {
        "instances": instances,
        "mode": mode_run.mode.value,
        # the torch default is left out: existing cluster configs stay as they were
        "model": {**RUN_MODEL, **({} if pdd.engine == "torch" else {"engine": pdd.engine})},
        "timing": {"time_scale": pdd.time_scale, "kv_scale_k": scale,
                   "kv_bytes_per_token": pdd.kv_bytes_per_token, "token_scale": pdd.token_scale},
        "relay": {"handoff_mode": pdd.handoff_mode.value,
                  "catchup_threshold_tokens": pdd.catchup_threshold_tokens},
        "router": {"relay_threshold_s": pdd.relay_threshold_s,
                   "relay_margin_quantile": pdd.relay_margin_quantile,
                   "anomalous_filter": pdd.anomalous_filter,
                   "late_kv_local": pdd.late_kv_local,
                   "anomalous_min_input_tokens": pdd.anomalous_min_input_tokens,
                   "anomalous_max_output_tokens": pdd.anomalous_max_output_tokens,
                   "wan_prior_gbit": topo.wan.a_to_b.rate_gbit,
                   "wan_rtt_s": topo.wan.rtt_ms / 1000.0,
                   "local_gbit": local_gbit(topo),
                   **({"policy": mode_run.policy, "policy_params": dict(mode_run.params)}
                      if getattr(mode_run, "policy", "") else {})},
        "client": {"request_timeout_s": pdd.request_timeout_s},
        **({} if pdd.drc else {"main": {"drc_capacity_tokens": 0}}),  # 0: MD reuses nothing
        **settings,
    }


def local_gbit(topo: Topology) -> float:
    """The local path P -> RLD's nominal rate: the slowest host link of a P or an RLD
    host (100 Gbit/s, the router's default, if the topology has neither)."""
    rates = [h.link.rate_gbit for h in topo.hosts
             if TopoRole.PREFILL in h.roles or TopoRole.RELAY_DECODE in h.roles]
    return min(rates) if rates else 100.0


def workload_lines(workload) -> list[dict]:
    """The client's workload.jsonl as objects: warm-up requests (``"warmup": true``)
    first, then the measured ones (``testbed.pdd.roles.client.load_requests`` reads them)."""
    out = []
    for r in workload.warmup + workload.requests:
        line = {"id": r.id, "arrival_s": r.arrival_s, "prompt": list(r.prompt),
                "max_out": r.output_len, "session": r.session,
                "designed_hit_rate": r.designed_hit_rate}
        if r.warmup:
            line["warmup"] = True
        out.append(line)
    return out
