"""metav1.Condition bookkeeping: lastTransitionTime moves only when a condition's status flips."""

from __future__ import annotations

import functools
from datetime import UTC, datetime

from orchestrator import api

__all__ = [
    "FIXES",
    "PROVIDER_UNAVAILABLE",
    "blocking_condition",
    "cause_first",
    "fix_for",
    "format_micro_time",
    "format_time",
    "get_condition",
    "parse_time",
    "partly_degraded",
    "set_condition",
    "with_fix",
]


#: The reason of a run over several providers one of which does not answer (the run's Degraded
#: condition, naming it) and of its clusters that wait for it (Snapshot.unknown): the others go
#: on where the floor allows, so it is not a condition that stops the run.
PROVIDER_UNAVAILABLE = "ProviderUnavailable"
#: Degraded reasons that do not stop the run: failed clusters are listed apart; a provider of
#: several down leaves the others going.
_GOING_ON = frozenset({"ClusterFailed", PROVIDER_UNAVAILABLE})


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as metav1.Time serialises."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds, as metav1.MicroTime serialises."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@functools.lru_cache(maxsize=4096)
def parse_time(text: str) -> datetime:
    """Parse a metav1.Time or metav1.MicroTime string (cached: a pass parses the same few
    stamps thousands of times, and strptime is the costliest part of following a cluster)."""
    layout = "%Y-%m-%dT%H:%M:%S.%fZ" if "." in text else "%Y-%m-%dT%H:%M:%SZ"
    return datetime.strptime(text, layout).replace(tzinfo=UTC)


def get_condition(conditions: list[api.Condition] | None, ctype: str) -> api.Condition | None:
    """The condition of a type, if present."""
    return next((c for c in conditions or [] if c.type == ctype), None)


def set_condition(
    conditions: list[api.Condition],
    ctype: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[api.Condition]:
    """Return conditions with ctype set (apimachinery SetStatusCondition semantics); generation
    None leaves observedGeneration unset (a status no spec generation is judged by)."""
    value = "True" if status else "False"
    old = get_condition(conditions, ctype)
    when = old.last_transition_time if old is not None and old.status == value else format_time(now)
    new = api.Condition(
        type=ctype,
        status=value,
        reason=reason,
        message=message[:32768],
        observed_generation=generation,
        last_transition_time=when,
    )
    return [new if c.type == ctype else c for c in conditions] if old else [*conditions, new]


def blocking_condition(conditions: list[api.Condition] | None) -> api.Condition | None:
    """The condition that says why a run cannot progress, if one does: `Degraded` True (the
    plugin unreachable, TLS, Secrets, access; not `ClusterFailed`, failed clusters are listed
    apart), else `Ready` False with reason `InvalidSpec`. The one reading of it: the
    ClusterVersion's message leads with it, `status` and `wait` show it."""
    degraded = get_condition(conditions, "Degraded")
    if degraded is not None and degraded.status == "True" and degraded.reason not in _GOING_ON:
        return degraded
    ready = get_condition(conditions, "Ready")
    if ready is not None and ready.status == "False" and ready.reason == "InvalidSpec":
        return ready
    return None


def partly_degraded(conditions: list[api.Condition] | None) -> api.Condition | None:
    """`Degraded` True for a reason that does not stop the run (a provider of several down):
    what `status` shows beside the run's progress, not as why it cannot progress."""
    degraded = get_condition(conditions, "Degraded")
    if (
        degraded is not None
        and degraded.status == "True"
        and degraded.reason == PROVIDER_UNAVAILABLE
    ):
        return degraded
    return None


def cause_first(code: str, message: str) -> str:
    """A failed call's words with its gRPC code said once, after the cause: "plugin H:P:
    unreachable (UNAVAILABLE)" stays as it is (the classified words carry the code), a plugin's
    own answer "CLUSTER_BUSY: ..." gains " (FAILED_PRECONDITION)"."""
    if not code or code in message:
        return message
    return f"{message} ({code})" if message else code


#: The fix of a cause whose message does not carry one, by the condition's reason. A plugin
#: call's failure carries its own where one is known (plugins.sdk.endpoint_errors).
FIXES = {
    "TLSConfigError": "create the TLS Secret or key named (a FleetProvider's in the "
    "orchestrator's namespace, an opsEndpoint's in this one); the orchestrator tries again "
    "every 30s",
    "SecretError": "create the Secret or key named in this namespace; the orchestrator tries "
    "again every 30s",
    "InvalidSpec": "fix the fields named (`kubectl edit`); the run goes on once the spec is valid",
}


def fix_for(reason: str, message: str) -> str:
    """The fix of a condition (FIXES), unless its message already says one ("cause; fix")."""
    return "" if "; " in message else FIXES.get(reason, "")


def with_fix(reason: str, message: str) -> str:
    """A condition's message with its fix where one is known and the message has none."""
    fix = fix_for(reason, message)
    return f"{message}; {fix}" if fix else message
