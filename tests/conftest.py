"""Shared pytest fixtures: one local Kubernetes control plane per test run, a namespace per test.

Fixtures (tests using any of them are marked `kube` automatically):
- `kube_binaries` (session) -> (kube-apiserver path, etcd path).
- `control_plane` (session) -> KubeCluster: etcd + kube-apiserver with the project's CRDs.
- `extra_apiserver` (session) -> Callable[[str], KubeCluster]: another apiserver (a hub or a
  member cluster) on the same etcd under its own prefix; the same name returns the same one.
- `namespace` (function) -> str: a fresh namespace on `control_plane`, deleted afterwards.
- `garbage_collected` (session) -> KubeCluster: an apiserver of its own ("gc") with the
  project's CRDs and a real kube-controller-manager running only the garbage collector (so it
  collects nothing of the other tests'); `gc_namespace` (function) -> a namespace there.

Without a built kube-apiserver (scripts/build-kube-apiserver) or etcd these tests are skipped,
except under CI=true, where they fail: CI must never pass by skipping them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.controlplane import MAIN, ControlPlane, ControlPlaneError, find_binaries
from orchestrator.adapters.kube import KubeError
from tests.support.kube import PROJECT_CRDS, KubeCluster

# Names where an unclosed TLS socket was opened when its ResourceWarning fails a test.
pytest_plugins = ["tests.support.socket_origins"]

_KUBE_FIXTURES = frozenset(
    {
        "control_plane",
        "extra_apiserver",
        "kube_binaries",
        "namespace",
        "garbage_collected",
        "gc_namespace",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the control plane as `kube` (so `-m "not kube"` works)."""
    for item in items:
        if _KUBE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kube)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def kube_binaries() -> tuple[Path, Path]:
    """(kube-apiserver, etcd) paths; skips the test when absent, fails instead under CI=true."""
    apiserver, etcd = find_binaries()
    if apiserver is not None and etcd is not None:
        return apiserver, etcd
    missing = [n for n, p in (("kube-apiserver", apiserver), ("etcd", etcd)) if p is None]
    reason = (
        f"{' and '.join(missing)} not found: run scripts/build-kube-apiserver "
        "(a one-time build of about 7 minutes) to run the kube tests"
    )
    if _in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def _kube_plane(
    kube_binaries: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    apiserver, etcd = kube_binaries
    workdir = tmp_path_factory.mktemp("control-plane")
    # A throwaway plane: etcd's data on tmpfs (no disk fsync per write).
    plane = ControlPlane(workdir, kube_apiserver=apiserver, etcd=etcd, etcd_in_memory=True)
    try:
        plane.start()
    except ControlPlaneError as error:
        plane.stop(purge=True)
        pytest.fail(f"control plane: {error}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop(purge=True)


@pytest.fixture(scope="session")
def control_plane(_kube_plane: ControlPlane) -> Iterator[KubeCluster]:
    """The main apiserver of the session's control plane, with the project's CRDs installed."""
    cluster = KubeCluster(_kube_plane.apiservers[MAIN])
    try:
        try:
            cluster.install_crds(PROJECT_CRDS)
        except KubeError as error:
            pytest.fail(f"the apiserver rejects a CRD of {PROJECT_CRDS}: {error}", pytrace=False)
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def extra_apiserver(_kube_plane: ControlPlane) -> Iterator[Callable[[str], KubeCluster]]:
    """Factory: `extra_apiserver("hub")` starts (once per session) an apiserver named "hub".

    It shares etcd with `control_plane` under the prefix /clusters/<name>, so its objects are
    separate; it has its own kubeconfig and no CRDs until the test installs some.
    """
    clusters: dict[str, KubeCluster] = {}

    def start(name: str) -> KubeCluster:
        if name not in clusters:
            try:
                server = _kube_plane.add_apiserver(name)
            except ControlPlaneError as error:
                pytest.fail(f"extra apiserver {name}: {error}", pytrace=False)
            clusters[name] = KubeCluster(server)
        return clusters[name]

    try:
        yield start
    finally:
        for cluster in clusters.values():
            cluster.close()


def _prefix(request: pytest.FixtureRequest) -> str:
    """A namespace name prefix from the test's name."""
    prefix = request.node.name.lower().replace("_", "-")
    return "".join(c for c in prefix if c.isalnum() or c == "-").strip("-")[:30] or "test"


@pytest.fixture
def namespace(control_plane: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of its own for this test on the main apiserver; deleted with its contents."""
    with control_plane.temporary_namespace(_prefix(request)) as name:
        yield name


@pytest.fixture(scope="session")
def garbage_collected(
    _kube_plane: ControlPlane,
    kube_binaries: tuple[Path, Path],
    extra_apiserver: Callable[[str], KubeCluster],
) -> KubeCluster:
    """An apiserver of its own with the project's CRDs, and the real garbage collector on it
    (kube-controller-manager, cached beside kube-apiserver by scripts/build-kube-apiserver)."""
    binary = kube_binaries[0].parent / "kube-controller-manager"
    if not os.access(binary, os.X_OK):
        reason = (
            f"{binary} not found: run scripts/build-kube-apiserver (it builds "
            "kube-controller-manager beside kube-apiserver) to run the garbage-collector tests"
        )
        if _in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    cluster = extra_apiserver("gc")
    try:
        cluster.install_crds(PROJECT_CRDS)
        # After the CRDs: the collector then watches our kinds from its first sync.
        _kube_plane.start_garbage_collector("gc", binary)
    except (KubeError, ControlPlaneError) as error:
        pytest.fail(f"garbage collector: {error}", pytrace=False)
    return cluster


@pytest.fixture
def gc_namespace(garbage_collected: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of its own for this test on the `garbage_collected` apiserver."""
    with garbage_collected.temporary_namespace(_prefix(request)) as name:
        yield name
