"""upgradeMethod ClusterCurator: the curator we write and how its conditions read (pure functions).

The condition vocabulary is stolostron/cluster-curator-controller's: the curator job records a
condition per step (type = the step, e.g. "upgrade-cluster", "monitor-upgrade") and the overall
"clustercurator-job" condition. Reason "Job_has_finished" is used for progress records and for
the end (status False while running, True when done); reason "Job_failed" with status True marks
a failure, and its message says why. On success the job clears spec.curatorJob and the earlier
conditions, leaving "clustercurator-job" True.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.ocm.config import OcmConfig
from plugins.ocm.objects import (
    ANNOTATION_OPERATION_ID,
    ANNOTATION_REQUEST_ID,
    ANNOTATION_STARTED_AT,
    ANNOTATION_TARGET_VERSION,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    Verdict,
    condition,
    format_time,
    timed_out,
    version_reached,
)

__all__ = [
    "CONDITION_CURATOR_JOB",
    "CONDITION_MONITOR_UPGRADE",
    "CONDITION_UPGRADE_CLUSTER",
    "REASON_JOB_FAILED",
    "REASON_JOB_FINISHED",
    "curator_patch",
    "curator_verdict",
    "running_job",
]

CONDITION_CURATOR_JOB = "clustercurator-job"
CONDITION_UPGRADE_CLUSTER = "upgrade-cluster"
CONDITION_MONITOR_UPGRADE = "monitor-upgrade"
REASON_JOB_FINISHED = "Job_has_finished"
REASON_JOB_FAILED = "Job_failed"

_RUNNING, _SUCCEEDED, _FAILED = (
    cluster_pb2.OPERATION_STATE_RUNNING,
    cluster_pb2.OPERATION_STATE_SUCCEEDED,
    cluster_pb2.OPERATION_STATE_FAILED,
)
_PERCENT = re.compile(r"(\d{1,3})% complete")
# Step conditions in the order an upgrade curation runs them, with the progress they stand for.
_STEP_PROGRESS = (
    ("prehook-ansiblejob", 10),
    (CONDITION_UPGRADE_CLUSTER, 25),
    (CONDITION_MONITOR_UPGRADE, 30),
    ("posthook-ansiblejob", 90),
)


def curator_patch(
    cfg: OcmConfig,
    cluster: str,
    version: str,
    request_id: str,
    operation_id: str,
    now: datetime,
) -> dict[str, Any]:
    """The merge patch (or, with apiVersion/kind added, the body) that asks for the upgrade.

    It sets desiredCuration upgrade and upgrade.desiredUpdate, channel/upstream when
    configured and monitorTimeout (minutes); annotates the request; and clears the status left
    by an earlier curation (ClusterCurator has no status subresource; the curator job itself
    clears it the same way when a curation ends), so only this curation's conditions count.
    """
    upgrade: dict[str, Any] = {
        "desiredUpdate": version,
        "monitorTimeout": cfg.monitor_timeout_minutes,
    }
    if cfg.cluster_curator.channel:
        upgrade["channel"] = cfg.cluster_curator.channel
    if cfg.cluster_curator.upstream:
        upgrade["upstream"] = cfg.cluster_curator.upstream
    return {
        "metadata": {
            "name": cluster,
            "namespace": cluster,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": {
                ANNOTATION_REQUEST_ID: request_id,
                ANNOTATION_OPERATION_ID: operation_id,
                ANNOTATION_TARGET_VERSION: version,
                ANNOTATION_STARTED_AT: format_time(now),
            },
        },
        "spec": {"desiredCuration": "upgrade", "upgrade": upgrade},
        "status": None,
    }


def running_job(curator: Mapping[str, Any]) -> str:
    """The curation job the curator runs now (spec.curatorJob), "" when none."""
    return str((curator.get("spec") or {}).get("curatorJob") or "")


def _progress(conditions: Any) -> int:
    progress = 5
    for step, value in _STEP_PROGRESS:
        cond = condition(conditions, step)
        if cond is None:
            continue
        progress = max(progress, value)
        if step == CONDITION_MONITOR_UPGRADE:
            match = _PERCENT.search(str(cond.get("message") or ""))
            if match:
                progress = max(progress, 30 + min(100, int(match.group(1))) * 55 // 100)
            if cond.get("status") == "True":
                progress = max(progress, 85)
    return min(progress, 95)


def curator_verdict(
    curator: Mapping[str, Any],
    cluster_version: str,
    target: str,
    started: datetime,
    now: datetime,
    cfg: OcmConfig,
) -> Verdict:
    """Where the upgrade that this curator carries stands.

    FAILED when a step or the job reports Job_failed (its message is the error), when the job
    reports success but the ManagedCluster does not show the target version, or when
    monitorTimeout passed; SUCCEEDED when the job finished and the hub sees the version.
    """
    conditions = (curator.get("status") or {}).get("conditions")
    failures = [
        c
        for c in conditions or []
        if isinstance(c, Mapping)
        and c.get("reason") == REASON_JOB_FAILED
        and c.get("status") == "True"
    ]
    if failures:
        # A step's message names the cause; the job's summary names the curation.
        step = next((c for c in failures if c.get("type") != CONDITION_CURATOR_JOB), None)
        job = next((c for c in failures if c.get("type") == CONDITION_CURATOR_JOB), None)
        summary = str(job.get("message") or "") if job is not None else ""
        if step is not None:
            cause = str(step.get("message") or "failed")
            text = f"curation step {step.get('type')} failed: {cause}"
            if summary and cause not in summary:
                text += f" ({summary})"
        else:
            text = f"curation failed: {summary or 'no message'}"
        name = (curator.get("metadata") or {}).get("name", "")
        return Verdict(_FAILED, 0, "CURATION_FAILED", f"ClusterCurator {name}: {text}")
    job = condition(conditions, CONDITION_CURATOR_JOB)
    finished = (
        job is not None
        and job.get("status") == "True"
        and job.get("reason") == REASON_JOB_FINISHED
        and not running_job(curator)
    )
    if finished:
        if version_reached(cluster_version, target):
            return Verdict(_SUCCEEDED, 100)
        late = timed_out(
            started,
            now,
            cfg.monitor_timeout,
            f"the curation finished but the ManagedCluster reports version "
            f"{cluster_version or 'none'}, not {target}",
        )
        return late or Verdict(_RUNNING, 95, "", "curation finished; waiting for the new version")
    message = str(job.get("message") or "") if job else "waiting for the curator to start a job"
    return timed_out(started, now, cfg.monitor_timeout, message) or Verdict(
        _RUNNING, _progress(conditions), "", message
    )
