"""Who asked, as the orchestrator records it: the user the admission webhook authenticated, if
its stamp still speaks for the object's spec and people annotations; else "unauthenticated".

The typed `requested-by` survives only as a display name beside it (issue 24).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from orchestrator import api

__all__ = [
    "COPIED",
    "MOVED",
    "PEOPLE_ANNOTATIONS",
    "STAMPS",
    "UNAUTHENTICATED",
    "attested",
    "handed",
    "handover",
    "requester",
    "retyped",
]


#: Annotations through which people ask something of a run; a request changing one of them (or
#: the spec: a stop, a resume, a new target) is stamped with its authenticated user.
PEOPLE_ANNOTATIONS = (
    api.ANNOTATION_APPROVE_STAGES,
    api.ANNOTATION_RETRY_CLUSTERS,
    api.ANNOTATION_SKIP_CLUSTERS,
    api.ANNOTATION_SKIP_STAGES,
    api.ANNOTATION_REASON,
    api.ANNOTATION_REQUESTED_BY,
)


#: The annotations only the webhook writes.
STAMPS = (
    api.ANNOTATION_REQUESTED_BY_USER,
    api.ANNOTATION_REQUESTED_BY_GROUPS,
    api.ANNOTATION_REQUESTED_BY_STAMP,
)


#: Recorded when no stamp vouches for the request (the webhook down: failurePolicy Ignore, or
#: not installed).
UNAUTHENTICATED = "unauthenticated"


def attested(annotations: Mapping[str, str], spec: Any) -> str:
    """The digest a stamp vouches for: the spec and the people annotations, as written."""
    said = {k: annotations[k] for k in PEOPLE_ANNOTATIONS if k in annotations}
    text = json.dumps({"spec": spec, "annotations": said}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _vouched(annotations: Mapping[str, str], spec: Any) -> bool:
    user = annotations.get(api.ANNOTATION_REQUESTED_BY_USER) or ""
    stamp = annotations.get(api.ANNOTATION_REQUESTED_BY_STAMP) or ""
    return bool(user) and stamp == attested(annotations, spec)


def handed(annotations: Mapping[str, str], spec: Any) -> dict[str, str]:
    """The user and groups a ClusterVersion hands to its run with its requests: those of its
    stamp when the stamp still vouches for it, else none (the run then records
    "unauthenticated"). The digest is not handed: the webhook makes the run's own."""
    if not _vouched(annotations, spec):
        return {}
    return {k: annotations[k] for k in STAMPS[:2] if k in annotations}


#: Annotations a ClusterVersion hands to its current run and removes from itself (consumed).
MOVED = (api.ANNOTATION_RETRY_CLUSTERS, api.ANNOTATION_SKIP_CLUSTERS)
#: Level-triggered requests a ClusterVersion copies to its current run as they are (unset:
#: removed).
COPIED = (api.ANNOTATION_APPROVE_STAGES, api.ANNOTATION_SKIP_STAGES)
#: What a person types with a request: copied with the requests it goes with.
_WORDS = (api.ANNOTATION_REASON, api.ANNOTATION_REQUESTED_BY)


def handover(
    cv_annotations: Mapping[str, str],
    cv_spec: Any,
    run_annotations: Mapping[str, str],
    spec_handed: bool,
) -> dict[str, str | None]:
    """The merge patch of a run's annotations when its ClusterVersion hands its requests over
    (spec_handed: its live spec fields change the run's too): the copied and moved requests,
    and with them who asked (the typed words, and the stamp's user and groups while the
    ClusterVersion's stamp vouches for it, else none). Without a request nothing of who asked
    is written: a request a person made on the run itself keeps its own stamp, and is never
    told as the ClusterVersion's last writer's."""
    patch: dict[str, str | None] = {
        k: cv_annotations.get(k) for k in COPIED if cv_annotations.get(k) != run_annotations.get(k)
    }
    for key in MOVED:
        if cv_annotations.get(key):
            merged = {*_csv(run_annotations.get(key)), *_csv(cv_annotations[key])}
            patch[key] = ",".join(sorted(merged))
    if not patch and not spec_handed:
        return {}
    stamps = handed(cv_annotations, cv_spec)
    for key in _WORDS:
        if cv_annotations.get(key) != run_annotations.get(key):
            patch[key] = cv_annotations.get(key)
    for key in STAMPS[:2]:
        if stamps.get(key) != run_annotations.get(key):
            patch[key] = stamps.get(key)
    return patch


def _csv(value: str | None) -> set[str]:
    return {v.strip() for v in (value or "").split(",") if v.strip()}


def requester(annotations: Mapping[str, str], spec: Any) -> str:
    """Who asked, for status, Events and notifications: "alice", "alice (as cto@example.com)"
    when the typed display name differs, or "unauthenticated (as cto@example.com)" when no
    stamp vouches for what is written now."""
    typed = annotations.get(api.ANNOTATION_REQUESTED_BY) or ""
    user = annotations.get(api.ANNOTATION_REQUESTED_BY_USER) or ""
    if not _vouched(annotations, spec):
        user = UNAUTHENTICATED
    return _as_named(user, typed)


def retyped(recorded: str, typed: str | None) -> str:
    """Who asked through a spec field (spec.retry / spec.skip `requestedBy`): the requester
    recorded for the run (`requester`), its typed display name replaced by this one; without
    a recorded requester (the engine run alone), the typed name."""
    if not recorded:
        return typed or ""
    if not typed:
        return recorded
    return _as_named(recorded.split(_AS, 1)[0], typed)


_AS = " (as "


def _as_named(who: str, typed: str) -> str:
    """who, with a typed display name beside it when the name differs."""
    return f"{who}{_AS}{typed})" if typed and typed != who else who
