"""What a condition's message says when a run cannot progress (issue 24): the cause first, a
gRPC code said once, then the fix where one is known, never twice."""

from __future__ import annotations

from datetime import timedelta

from orchestrator import api
from orchestrator.engine.conditions import cause_first, fix_for, with_fix
from orchestrator.engine.decide import Call, call_failed
from orchestrator.engine.observations import OpKind
from orchestrator.pipeline.driver import CallError
from orchestrator.pipeline.simulate import T0

U = api.UpgradePhase


def test_the_code_is_said_once_after_the_cause() -> None:
    # The transport's classified words already carry the code: kept as they are.
    transport = "plugin 10.0.0.1:9090: unreachable (UNAVAILABLE); check that the plugin runs"
    assert cause_first("UNAVAILABLE", transport) == transport
    assert str(CallError("UNAVAILABLE", transport, True)) == transport
    # A plugin's own answer (its ErrorInfo reason first) gains the code after it.
    answered = "CLUSTER_BUSY: an upgrade is running"
    assert cause_first("FAILED_PRECONDITION", answered) == (
        "CLUSTER_BUSY: an upgrade is running (FAILED_PRECONDITION)"
    )
    assert cause_first("UNKNOWN", "") == "UNKNOWN"


def test_a_fix_is_added_where_known_and_never_twice() -> None:
    missing = "spec.opsEndpoint.tls.caSecretRef: Secret plugin-ca does not exist"
    fixed = with_fix("TLSConfigError", missing)
    assert fixed.startswith(f"{missing}; create the TLS Secret or key named")
    assert fix_for("TLSConfigError", fixed) == ""  # the message carries it now
    assert with_fix("TLSConfigError", fixed) == fixed
    # A message that says its own fix, and a reason without a known fix, stay as they are.
    own = "spec.x: the orchestrator may not read Secrets here; use a FleetProvider"
    assert with_fix("SecretError", own) == own
    assert with_fix("PluginUnavailable", "ACCESS: no (PERMISSION_DENIED)") == (
        "ACCESS: no (PERMISSION_DENIED)"
    )


def test_a_failed_calls_words_on_the_cluster_say_the_code_once() -> None:
    call = Call(OpKind.CONTROL_PLANE, "c00000", "rid", "run-c0", reissue=False)
    flying = api.ClusterUpgradeStatus(phase=U.UPGRADING_CONTROL_PLANE)
    words = "plugin 10.0.0.1:9090: unreachable (UNAVAILABLE)"
    again, wait = call_failed(flying, call, "UNAVAILABLE", True, words, T0)
    assert (again.phase, wait) == (U.UPGRADING_CONTROL_PLANE, 2.0)
    assert again.message == f"will ask again: controlPlane: {words}"
    refused, wait = call_failed(
        flying, call, "INVALID_ARGUMENT", False, "BAD_POOL: no pool x", T0 + timedelta(seconds=1)
    )
    assert (refused.phase, refused.reason, wait) == (U.FAILED, "Refused", None)
    assert refused.message == "controlPlane: BAD_POOL: no pool x (INVALID_ARGUMENT)"
