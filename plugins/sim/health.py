"""The sim's health data: workloads and their verdicts, metric query templates."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf import timestamp_pb2

from fleetupgrade.plugin.v1 import health_pb2
from plugins.sim.config import WorkloadSpec

__all__ = ["Workload", "render_query", "verdict", "workload_of"]

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\}\}")


def render_query(template: str, args: Mapping[str, str]) -> str:
    """Replaces {{name}} placeholders with args[name]; unknown placeholders stay as written."""
    return _PLACEHOLDER.sub(lambda m: args.get(m.group(1), m.group(0)), template)


@dataclass(slots=True)
class Workload:
    kind: str
    healthy_replicas: int
    health: float | None  # None: no fresh data


def workload_of(spec: WorkloadSpec) -> Workload:
    health = None if spec.health == "unknown" else float(spec.health)
    return Workload(spec.kind, spec.healthy_replicas, health)


def verdict(
    cluster_id: str,
    observed: timestamp_pb2.Timestamp,
    workloads: Mapping[tuple[str, str], Workload],
    wanted: health_pb2.Workload,
) -> health_pb2.WorkloadResult:
    """The CheckWorkloads result of one wanted workload on one cluster's data."""
    result = health_pb2.WorkloadResult(cluster_id=cluster_id, workload=wanted)
    result.observed_time.CopyFrom(observed)
    name = f"{wanted.namespace}/{wanted.name}"
    entry = workloads.get((wanted.namespace, wanted.name))
    if entry is None:
        result.health = health_pb2.WORKLOAD_HEALTH_MISSING
        result.message = f"workload {name} not found on cluster {cluster_id}"
        return result
    if wanted.kind and entry.kind.lower() != wanted.kind.lower():
        result.health = health_pb2.WORKLOAD_HEALTH_MISSING
        result.message = f"workload {name} is a {entry.kind}, not a {wanted.kind}"
        return result
    result.healthy_replicas = entry.healthy_replicas
    if entry.health is None:
        result.health = health_pb2.WORKLOAD_HEALTH_UNKNOWN
        result.message = f"no fresh health data for workload {name}"
        return result
    result.observed_value = entry.health
    need = wanted.min_healthy_replicas or 1
    healthy = entry.health >= 1.0 and entry.healthy_replicas >= need
    result.health = (
        health_pb2.WORKLOAD_HEALTH_HEALTHY if healthy else (health_pb2.WORKLOAD_HEALTH_UNHEALTHY)
    )
    result.message = (
        f"{entry.healthy_replicas} healthy replicas (need {need}), workload_health {entry.health:g}"
    )
    return result
