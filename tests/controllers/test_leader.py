"""Leader election on a real Lease: one leader at a time, takeover after expiry, exit on loss."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestrator.adapters.kube import KubeClient
from orchestrator.adapters.leader import LeaderElector
from tests.support.kube import KubeCluster, wait_for
from tests.support.orchestrator import OrchestratorProcess


def test_second_candidate_waits_then_takes_over(control_plane: KubeCluster, namespace: str) -> None:
    kube = KubeClient(str(control_plane.kubeconfig))
    try:
        a = LeaderElector(
            kube, namespace, "lock", "a", lease_seconds=2, renew_deadline=1.5, retry_period=0.2
        )
        b = LeaderElector(
            kube, namespace, "lock", "b", lease_seconds=2, renew_deadline=1.5, retry_period=0.2
        )
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
        assert a.try_acquire_or_renew()  # renewal by the holder
        record = kube.get_lease(namespace, "lock")
        assert record is not None and record.holder == "a"
        stop = threading.Event()
        started = time.monotonic()
        assert b.acquire(stop)  # a stopped renewing: b takes over once the lease expires
        assert time.monotonic() - started >= 1.5
        record = kube.get_lease(namespace, "lock")
        assert record is not None and record.holder == "b" and record.transitions == 1
    finally:
        kube.close()


def test_deposed_leader_calls_on_lost(control_plane: KubeCluster, namespace: str) -> None:
    kube = KubeClient(str(control_plane.kubeconfig))
    try:
        a = LeaderElector(
            kube, namespace, "lock2", "a", lease_seconds=1, renew_deadline=0.8, retry_period=0.1
        )
        assert a.try_acquire_or_renew()
        lost = threading.Event()
        stop = threading.Event()
        a.keep(stop, lost.set)
        # Someone else grabs the lease behind a's back (e.g. a partition healed late).
        record = kube.get_lease(namespace, "lock2")
        assert record is not None
        from datetime import UTC, datetime, timedelta

        far = datetime.now(UTC) + timedelta(hours=1)
        kube.write_lease(
            namespace,
            "lock2",
            "intruder",
            3600,
            record.transitions + 1,
            far.replace(microsecond=5),
            far.replace(microsecond=5),
            record.resource_version,
        )
        assert lost.wait(5), "the deposed leader never noticed"
        stop.set()
    finally:
        kube.close()


def test_orchestrator_exits_when_leadership_is_lost(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    proc = OrchestratorProcess(
        control_plane.kubeconfig,
        namespace,
        tmp_path / "o.log",
        "--enable-leader-election",
        "--leader-election-namespace",
        namespace,
    )
    proc.start()
    kube = KubeClient(str(control_plane.kubeconfig))
    try:
        record = wait_for(
            "the orchestrator takes the lease",
            lambda: kube.get_lease(namespace, "fleet-orchestrator"),
            timeout=30,
        )
        from datetime import UTC, datetime, timedelta

        far = datetime.now(UTC) + timedelta(hours=1)
        kube.write_lease(
            namespace,
            "fleet-orchestrator",
            "intruder",
            3600,
            record.transitions + 1,
            far.replace(microsecond=5),
            far.replace(microsecond=5),
            record.resource_version,
        )
        assert proc.proc is not None
        code = proc.proc.wait(timeout=30)  # renew deadline 10 s, then exit
        assert code == 1
        assert "leadership lost" in (tmp_path / "o.log").read_text()
    finally:
        proc.stop()
        kube.close()


@pytest.mark.parametrize("skew", [20.0, -20.0])
def test_skewed_wall_clocks_never_give_two_leaders(
    control_plane: KubeCluster, namespace: str, skew: float
) -> None:
    """b's wall clock is `skew` s off a's: a renewing leader is never deposed, and once a stops
    renewing b takes over only after a stopped acting and b saw the Lease unchanged for a
    whole lease duration on its own clock; at no poll do both believe they lead."""
    kube = KubeClient(str(control_plane.kubeconfig))
    timing: dict[str, Any] = {"lease_seconds": 3, "renew_deadline": 2.0, "retry_period": 0.3}
    a = LeaderElector(kube, namespace, "skewed", "a", **timing)
    b = LeaderElector(
        kube,
        namespace,
        "skewed",
        "b",
        clock=lambda: datetime.now(UTC) + timedelta(seconds=skew),
        **timing,
    )
    stop_a, stop_b, a_lost = threading.Event(), threading.Event(), threading.Event()
    b_result: list[bool] = []
    try:
        assert a.try_acquire_or_renew()
        a.keep(stop_a, a_lost.set)
        standby = threading.Thread(target=lambda: b_result.append(b.acquire(stop_b)))
        standby.start()

        def both() -> None:
            assert not (a.held() and b.held()), "a and b both believe they hold the Lease"

        until = time.monotonic() + 8  # a renews all along: it stays the one leader
        while time.monotonic() < until:
            both()
            assert a.held() and not b.held(), "the renewing leader a was deposed"
            time.sleep(0.02)
        assert not a_lost.is_set() and not b_result
        record = kube.get_lease(namespace, "skewed")
        assert record is not None and record.holder == "a" and record.transitions == 0

        stop_a.set()  # a stops renewing (as if partitioned); it keeps its belief
        stopped = time.monotonic()
        while not b.held():
            both()
            assert time.monotonic() - stopped < 15, "b never took over from a silent leader"
            time.sleep(0.02)
        took = time.monotonic() - stopped
        assert not a.held()
        assert took >= 3 - 0.3, f"b took the Lease {took:.2f} s after a's last renewal"
        standby.join(5)
        assert b_result == [True]
        record = kube.get_lease(namespace, "skewed")
        assert record is not None and record.holder == "b" and record.transitions == 1
        for _ in range(50):
            both()
            time.sleep(0.02)
    finally:
        stop_a.set()
        stop_b.set()
        kube.close()
