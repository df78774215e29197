"""`fleet-orchestrator wait` against the real local apiserver: the exit code and the words it
ends with, for each way a run ends (statuses written through the status subresource, as the
controllers would leave them)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator import api
from tests.operate.test_cli import Objects, cli, objects
from tests.support.kube import KubeCluster

__all__ = ["objects"]  # the fixture, shared with test_cli


def _end(objects: Objects, plural: str, name: str, **status: Any) -> None:
    """Write STATUS over the object's status, observed at its current generation."""
    obj = objects.kube.get_object(plural, objects.ns, name)
    new = {**(obj.get("status") or {}), **status}
    new["observedGeneration"] = obj["metadata"]["generation"]
    objects.write_status(plural, obj, new)


def _observe_cv(objects: Objects) -> None:
    _end(objects, api.PLURAL, "prod")


def test_wait_exits_zero_when_the_run_succeeds(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    _observe_cv(objects)
    _end(objects, api.UPDATE_RUN_PLURAL, "prod-1")
    # Progressing: the run ends while `wait` polls.
    later = threading.Timer(
        1.0,
        _end,
        (objects, api.UPDATE_RUN_PLURAL, "prod-1"),
        {"phase": "Succeeded", "message": "4 clusters upgraded"},
    )
    later.start()
    try:
        code, out, err = cli(
            control_plane, objects.ns, "wait", "prod", "--interval", "0.2", capsys=capsys
        )
    finally:
        later.join()
    assert (code, err) == (0, "")
    assert "ClusterVersion prod: Progressing: stage wave-1: 1 cluster in flight" in out
    assert out.endswith("ClusterVersion prod (run prod-1) completed: 4 clusters upgraded\n")
    # The UpdateRun by its own name, too.
    code, out, _ = cli(control_plane, objects.ns, "wait", "prod-1", capsys=capsys)
    assert (code, out) == (0, "UpdateRun prod-1 completed: 4 clusters upgraded\n")


@pytest.mark.parametrize(
    ("phase", "code", "words"),
    [
        ("Halted", 3, "is Halted: failure budget exceeded: c3"),
        ("Failed", 4, "is Failed: failure budget exceeded: c3"),
        ("Stopped", 6, "is Stopped: failure budget exceeded: c3"),
    ],
)
def test_wait_exits_with_the_way_the_run_ended(
    control_plane: KubeCluster,
    objects: Objects,
    capsys: pytest.CaptureFixture[str],
    phase: str,
    code: int,
    words: str,
) -> None:
    _observe_cv(objects)
    _end(
        objects, api.UPDATE_RUN_PLURAL, "prod-1", phase=phase, message="failure budget exceeded: c3"
    )
    got, out, err = cli(control_plane, objects.ns, "wait", "prod", capsys=capsys)
    assert got == code
    assert out == ""
    assert err == f"ClusterVersion prod (run prod-1) {words}\n"


def test_wait_names_the_cause_of_an_invalid_run(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    _observe_cv(objects)
    ready = {
        "type": "Ready",
        "status": "False",
        "reason": "InvalidSpec",
        "message": "spec.requiredAvailableCount: 1 leaves no cluster allowed out of service",
        "lastTransitionTime": "2026-11-23T01:00:00Z",
    }
    _end(objects, api.UPDATE_RUN_PLURAL, "prod-1", phase="Invalid", conditions=[ready])
    code, out, err = cli(control_plane, objects.ns, "wait", "prod-1", capsys=capsys)
    assert (code, out) == (5, "")
    assert err == (
        "UpdateRun prod-1 is Invalid: InvalidSpec: spec.requiredAvailableCount: 1 leaves no "
        "cluster allowed out of service\n"
    )
    # An invalid ClusterVersion spec (no run can start) ends the wait on the ClusterVersion.
    _end(objects, api.PLURAL, "prod", phase="Invalid", message="spec.clusters[0].id: empty")
    code, _, err = cli(control_plane, objects.ns, "wait", "prod", capsys=capsys)
    assert (code, err) == (5, "ClusterVersion prod is Invalid: spec.clusters[0].id: empty\n")


def test_wait_for_a_stage(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    _observe_cv(objects)
    _end(objects, api.UPDATE_RUN_PLURAL, "prod-1")
    # canary is Completed while the run is still Progressing.
    code, out, err = cli(
        control_plane, objects.ns, "wait", "prod", "--for", "stage=canary", capsys=capsys
    )
    assert (code, err) == (0, "")
    assert out == "ClusterVersion prod (run prod-1): stage canary completed\n"
    # wave-1 is Progressing: the timeout ends the wait, with where it stood.
    code, out, err = cli(
        control_plane,
        objects.ns,
        "wait",
        "prod",
        "--for",
        "stage=wave-1",
        "--timeout",
        "1s",
        "--interval",
        "0.2",
        capsys=capsys,
    )
    assert code == 124
    assert err == (
        "timed out after 1s waiting; ClusterVersion prod: Progressing: stage wave-1: 1 cluster "
        "in flight\n"
    )
    # A stage the spec does not have is an error naming the stages it has.
    code, out, err = cli(
        control_plane, objects.ns, "wait", "prod", "--for", "stage=wave-9", capsys=capsys
    )
    assert (code, out) == (1, "")
    assert "has no stage 'wave-9'; its stages are canary, wave-1" in err


def test_wait_never_ends_on_a_status_of_the_previous_spec(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    # The run succeeded, then the ClusterVersion was edited (a new version applied): until the
    # controller observes the new generation, the old success is not the outcome.
    _end(objects, api.UPDATE_RUN_PLURAL, "prod-1", phase="Succeeded", message="done")
    _observe_cv(objects)
    objects.kube.merge_patch(
        api.PLURAL, objects.ns, "prod", {"spec": {"strategy": {"paused": True}}}
    )
    code, _, err = cli(
        control_plane,
        objects.ns,
        "wait",
        "prod",
        "--timeout",
        "1s",
        "--interval",
        "0.2",
        capsys=capsys,
    )
    assert code == 124 and err.startswith("timed out after 1s waiting; ")
    _observe_cv(objects)
    assert cli(control_plane, objects.ns, "wait", "prod", capsys=capsys)[0] == 0


def test_wait_refuses_a_bad_for_and_timeout(
    control_plane: KubeCluster, objects: Objects, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, words in (
        (("--for", "ready"), "'ready' is neither 'completed' nor 'stage=NAME'"),
        (("--timeout", "soon"), "'soon' is not a duration; write it like 30s, 10m or 1h30m"),
    ):
        with pytest.raises(SystemExit) as exit_:
            cli(control_plane, objects.ns, "wait", "prod", *args, capsys=capsys)
        assert exit_.value.code == 2
        assert words in capsys.readouterr().err
