"""upgradeMethod ClusterCurator: the curator we write and how its conditions read (pure functions).

The condition vocabulary is stolostron/cluster-curator-controller's (@ 2a35aed): the curator job
records a condition per step (type = the step, e.g. "upgrade-cluster", "monitor-upgrade") and
the overall "clustercurator-job" condition. Reason "Job_has_finished" is used for progress
records and for the end (status False while running, True when done, its message ending
"Version (<desiredUpdate>;<channel>;<upstream>;<type>;<pools>)"); reason "Job_failed" with
status True marks a failure, and its message says why. On success the job clears
spec.curatorJob and the status, then records "clustercurator-job" True; spec.desiredCuration
stays "upgrade" (cmd/curator/curator.go updateDoneClusterCurator).

Two controller rules decide whether a write starts a job, so an upgrade is asked for in writes
the controller acts on (see start_writes):
- its update predicate (controllers/clustercurator_controller.go newClusterCuratorPredicate)
  drops an update whose status changed, and any update while `operation` stays set or while
  spec.upgrade.intermediateUpdate is set;
- NeedToUpgrade (pkg/jobs/utils/helpers.go) launches nothing when the last clustercurator-job
  failed for the same desiredUpdate;channel;upstream, or finished at the same or a newer
  version.
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
from plugins.sdk import Reason, accepted, is_newer_version, refused_never

__all__ = [
    "CONDITION_CURATOR_JOB",
    "CONDITION_MONITOR_UPGRADE",
    "CONDITION_UPGRADE_CLUSTER",
    "REASON_JOB_FAILED",
    "REASON_JOB_FINISHED",
    "RESET_PATCH",
    "asks_for",
    "curator_patch",
    "curator_preflight",
    "curator_verdict",
    "intermediate_update",
    "job_version",
    "needs_reset",
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
_JOB_VERSION = re.compile(r"Version \(([^;)]*)")

RESET_PATCH: dict[str, Any] = {"status": None, "operation": None}
"""The first of two writes when the curator carries an earlier curation's record: its status
(and a leftover `operation`) cleared. The controller's predicate drops this update (its status
changed), so it starts nothing; the next write, the spec, is the one the controller acts on."""
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
    namespace: str = "",
) -> dict[str, Any]:
    """The merge patch (or, with apiVersion/kind added, the body) that asks for the upgrade,
    of ClusterCurator <namespace>/<cluster> (namespace: the cluster's own unless given: a
    hosted cluster's HostedCluster namespace).

    It sets desiredCuration upgrade and upgrade.desiredUpdate, channel/upstream when
    configured and monitorTimeout (minutes), and annotates the request. It never touches the
    status: an update that changes the status is dropped by the controller's predicate
    (RESET_PATCH clears it first, in a write of its own, when needed).
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
            "namespace": namespace or cluster,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": {
                ANNOTATION_REQUEST_ID: request_id,
                ANNOTATION_OPERATION_ID: operation_id,
                ANNOTATION_TARGET_VERSION: version,
                ANNOTATION_STARTED_AT: format_time(now),
            },
        },
        "spec": {"desiredCuration": "upgrade", "upgrade": upgrade},
    }


def asks_for(curator: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """True when the curator's spec already asks for the curation `patch` (curator_patch) asks
    for: the same desiredCuration and every spec.upgrade field the patch sets."""
    spec = curator.get("spec") or {}
    wanted = patch["spec"]
    upgrade = spec.get("upgrade") or {}
    return spec.get("desiredCuration") == wanted["desiredCuration"] and all(
        upgrade.get(k) == v for k, v in wanted["upgrade"].items()
    )


def intermediate_update(curator: Mapping[str, Any]) -> str:
    """spec.upgrade.intermediateUpdate (an EUS-to-EUS upgrade), "" when none.

    While it is set the controller drops every update of the curator, and the CRD's CEL rules
    forbid changing desiredUpdate: such a curator cannot be asked for another upgrade.
    """
    return str(((curator.get("spec") or {}).get("upgrade") or {}).get("intermediateUpdate") or "")


def job_version(curator: Mapping[str, Any]) -> str | None:
    """The desiredUpdate the last clustercurator-job condition names ("Version (X;..."); None
    when there is no such condition or it names no version (curators before ACM 2.3)."""
    job = condition((curator.get("status") or {}).get("conditions"), CONDITION_CURATOR_JOB)
    if job is None:
        return None
    match = _JOB_VERSION.search(str(job.get("message") or ""))
    return match.group(1) if match else None


def needs_reset(curator: Mapping[str, Any], target: str) -> bool:
    """True when the curator's status (or `operation`) must be cleared before asking for target.

    Kept only when the status is the record of a finished upgrade to an older version (the
    state a successful curation leaves): NeedToUpgrade then launches the new job by itself.
    Cleared otherwise: a failed curation (NeedToUpgrade never retries the same version, and its
    step failures would read as this upgrade's), a finished one at the same or a newer version,
    leftovers of another curation, or `operation` set (updates are dropped while it stays).
    """
    if curator.get("operation") is not None:
        return True
    conditions = (curator.get("status") or {}).get("conditions") or []
    if not conditions:
        return False
    job = condition(conditions, CONDITION_CURATOR_JOB)
    if job is None or len(conditions) != 1:
        return True
    message = str(job.get("message") or "")
    if job.get("status") != "True" or job.get("reason") != REASON_JOB_FINISHED:
        return True
    if "Failed" in message or "upgrade" not in message:
        return True
    done = job_version(curator)
    try:
        return done is None or not is_newer_version(target, done)
    except ValueError:
        return True


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
    named = job_version(curator)
    if named is not None and named != target:
        # The record of an earlier curation (kept when it finished at an older version):
        # this upgrade's job has not started yet.
        waiting = "waiting for the curator to start a job"
        return timed_out(started, now, cfg.monitor_timeout, waiting) or Verdict(
            _RUNNING, 5, "", waiting
        )
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


_OPENSHIFT = ("OpenShift", "OpenShiftDedicated")


def curator_preflight(
    cluster_id: str, version: str, cfg: OcmConfig, info: Mapping[str, Any] | None
) -> cluster_pb2.PreflightUpgradeResponse:
    """What the curator job's validateUpgradeVersion (pkg/jobs/hive/hive.go) would say about
    desiredUpdate = version, from the cluster's ManagedClusterInfo (ACM's foundation agent).

    info None (the plugin may not read ManagedClusterInfos) leaves nothing to judge by:
    ACCEPTED, and the curation decides. Otherwise REFUSED_NEVER for a cluster that is not
    OpenShift, a version not in status.distributionInfo.ocp.availableUpdates (none reported
    means none offered) or a configured channel not in ocp.desired.channels.
    """
    if info is None:
        return accepted()
    status = info.get("status") or {}
    vendor = str(status.get("kubeVendor") or "")
    if vendor and vendor not in _OPENSHIFT:
        return refused_never(
            "NOT_OPENSHIFT",
            f"cluster {cluster_id} runs {vendor}: ClusterCurator upgrades OpenShift clusters only; "
            "use upgradeMethod ManifestWork",
        )
    ocp = (status.get("distributionInfo") or {}).get("ocp") or {}
    offered = [str(v) for v in ocp.get("availableUpdates") or []]
    if version not in offered:
        listed = ", ".join(offered) or "none"
        return refused_never(
            Reason.VERSION_NOT_OFFERED,
            f"cluster {cluster_id} is not offered {version} (availableUpdates: {listed})",
        )
    channel = cfg.cluster_curator.channel
    channels = [str(c) for c in (ocp.get("desired") or {}).get("channels") or []]
    if channel and channels and channel not in channels:
        return refused_never(
            "CHANNEL_NOT_OFFERED",
            f"cluster {cluster_id} does not offer channel {channel} "
            f"(channels: {', '.join(channels)}); fix clusterCurator.channel",
        )
    return accepted()
