"""A cluster that left the inventory mid-upgrade (recorded Skipped, ClusterGone) and returns."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from orchestrator import api
from orchestrator.engine.decide import RunInput, decide, with_status
from orchestrator.engine.initialize import pin_upgrades
from orchestrator.engine.observations import OpKind
from orchestrator.pipeline.simulate import T0
from tests.engine.model import U, as_run_spec, make_fleet, spec_for

NEW = "1.29.1"

GONE = api.ClusterUpgradeStatus(
    phase=U.SKIPPED,
    step=OpKind.CONTROL_PLANE.value,
    request_id="uid-1:c00000:controlPlane:1.29.1:0",
    reason="ClusterGone",
    message="controlPlane: cluster left the plugin's inventory mid-upgrade",
    step_start_time="2026-01-01T00:00:00Z",
)


def _decide(in_service: bool) -> tuple[api.ClusterUpgradeStatus, list[tuple[OpKind, str]]]:
    fleet = make_fleet(4)
    fleet.clusters["c00000"] = replace(fleet.clusters["c00000"], in_service=in_service)
    spec = spec_for(fleet, NEW, required=3)
    pinned = pin_upgrades("run", as_run_spec(spec), fleet.clusters)
    assert not isinstance(pinned, list)
    by_id = {u.cluster_id: u for u in pinned.upgrades}
    by_id["c00000"] = with_status(by_id["c00000"], GONE)
    d = decide(
        RunInput(
            key="ns/run",
            uid="uid-1",
            spec=as_run_spec(spec),
            upgrades={u.name: u for u in by_id.values()},
            snapshot=fleet.snapshot(),
            now=T0 + timedelta(hours=3),
            preflight_supported=False,
        )
    )
    u = by_id["c00000"]
    return d.changed.get(u.name, u.status), [(c.kind, c.cluster_id) for c in d.calls]


def test_a_returned_cluster_still_out_of_service_is_carried_on_without_a_new_service_out() -> None:
    status, calls = _decide(in_service=False)
    # Carried on from where it stands: the next step of a fresh attempt (new request ids,
    # never the old attempt's reused).
    assert status.phase == U.UPGRADING_CONTROL_PLANE, status
    assert status.attempt == 1
    assert status.request_id is not None and status.request_id.endswith(":1"), status
    assert (OpKind.CONTROL_PLANE, "c00000") in calls
    assert (OpKind.SERVICE_OUT, "c00000") not in calls
    # The floor: it was down already; with floor 3 of 4 nothing else may go out.
    assert [c for c in calls if c[0] is OpKind.SERVICE_OUT] == []


def test_a_returned_cluster_in_service_stays_skipped() -> None:
    status, _ = _decide(in_service=True)
    assert status.phase == U.SKIPPED and status.reason == "ClusterGone", status
