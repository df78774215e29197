"""What the real kube-apiserver (and etcd) spend on the requests a rollout makes, on this machine.

A rollout writes each ClusterUpgrade's status about once per cluster step (invariant 6: the
intent is on record before the call), so the apiserver's CPU per status write, times the steps,
is CPU the rollout needs whatever the orchestrator does. This measures it on a private control
plane (devtools.controlplane, etcd on tmpfs as in the tests and bench_orchestrator):

- status writes of ClusterUpgrades (JSON patch with the resourceVersion, as
orchestrator.adapters.kube
  writes them), WRITERS at once, with a watch of ClusterUpgrades open (as the orchestrator's);
- the same writes without the watch (what the watch fan-out costs);
- GETs of a ClusterVersion listing N clusters (what reading a large spec costs).

Prints numbers; it is not a test.

    python -m benchmarks.bench_apiserver [--objects 1000] [--writes 5000] [--writers 32]
        [--cv-clusters 5000] [--gets 100]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.bench_orchestrator import control_plane
from orchestrator import api
from orchestrator.adapters.kube import KubeClient

__all__ = ["main"]

VERSION = "1.29.4"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _plane() -> Iterator[tuple[Path, dict[str, int]]]:
    with (
        tempfile.TemporaryDirectory(prefix="bench-apiserver-") as tmp,
        control_plane(Path(tmp) / "plane") as plane,
    ):
        yield plane


def _measure(pids: dict[str, int], count: int, work: Callable[[], None]) -> dict[str, float]:
    """Wall and CPU per request of each control-plane process and of this client."""
    before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    mine = time.process_time()
    started = time.perf_counter()
    work()
    wall = time.perf_counter() - started
    out = {name: (_cpu_seconds(pid) - before[name]) * 1e3 / count for name, pid in pids.items()}
    out["client (this process)"] = (time.process_time() - mine) * 1e3 / count
    out["rate"] = count / wall
    return out


def _status(attempt: int) -> dict[str, Any]:
    """A ClusterUpgrade status in the middle of an upgrade (the size the rollout writes)."""
    stamp = "2026-01-01T00:00:00Z"
    return {
        "phase": "UpgradingControlPlane",
        "step": "controlPlane",
        "requestId": f"uid:cluster:controlPlane:{VERSION}:{attempt}",
        "operationId": "op-0123456789",
        "attempt": attempt,
        "startTime": stamp,
        "stepStartTime": stamp,
        "lastTransitionTime": stamp,
        "message": "ServicingOut → UpgradingControlPlane",
    }


def _writes(
    kube: KubeClient, pids: dict[str, int], objects: int, writes: int, writers: int, watch: bool
) -> dict[str, float]:
    versions: dict[int, str] = {}
    for i in range(objects):
        made = kube.create_object(
            api.CLUSTER_UPGRADE_PLURAL,
            "bench",
            {
                "apiVersion": api.API_VERSION,
                "kind": api.CLUSTER_UPGRADE_KIND,
                "metadata": {
                    "name": f"cu-{'w' if watch else 'n'}-{i}",
                    "labels": {api.LABEL_RUN: "bench"},
                },
                "spec": {
                    "clusterId": f"cluster-{i}",
                    "version": VERSION,
                    "nodeVersion": VERSION,
                    "stage": "default",
                    "stageIndex": 0,
                    "provider": "127.0.0.1:1",
                },
            },
        )
        versions[i] = made["metadata"]["resourceVersion"]
    stop = threading.Event()
    if watch:

        def follow() -> None:
            for _ in kube.watch_objects(api.CLUSTER_UPGRADE_PLURAL, None, "0", 300):
                if stop.is_set():
                    return

        threading.Thread(target=follow, daemon=True).start()
        time.sleep(1.0)

    def write(j: int) -> None:
        i = j % objects
        name = f"cu-{'w' if watch else 'n'}-{i}"
        done = kube.write_status(
            api.CLUSTER_UPGRADE_PLURAL, "bench", name, _status(j // objects), versions[i]
        )
        versions[i] = done["metadata"]["resourceVersion"]

    def work() -> None:
        with ThreadPoolExecutor(writers) as pool:
            for start in range(0, writes, objects):  # one write per object at a time (no 409)
                list(pool.map(write, range(start, min(writes, start + objects))))

    try:
        return _measure(pids, writes, work)
    finally:
        stop.set()


def _gets(kube: KubeClient, pids: dict[str, int], clusters: int, gets: int) -> dict[str, float]:
    kube.create_object(
        api.PLURAL,
        "bench",
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": "large"},
            "spec": {
                "requiredAvailableCount": max(1, clusters * 4 // 5),
                "opsEndpoint": {"endpoint": "127.0.0.1:1", "insecure": True},
                "clusters": [
                    {"id": f"cluster-{i:05d}", "version": VERSION} for i in range(clusters)
                ],
            },
        },
    )

    def work() -> None:
        for _ in range(gets):
            kube.get_object(api.PLURAL, "bench", "large")

    return _measure(pids, gets, work)


def _row(what: str, numbers: dict[str, float]) -> str:
    cpu = ", ".join(f"{k} {v:.2f}" for k, v in numbers.items() if k != "rate")
    return f"{what}: {numbers['rate']:.0f}/s; CPU ms per request: {cpu}"


def main(argv: list[str] | None = None) -> int:
    """Prints the apiserver's CPU per status write and per large GET."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_apiserver")
    parser.add_argument("--objects", type=int, default=1000, help="ClusterUpgrades written")
    parser.add_argument("--writes", type=int, default=5000, help="status writes in all")
    parser.add_argument("--writers", type=int, default=32, help="writes at once (the product's)")
    parser.add_argument("--cv-clusters", type=int, default=5000, help="clusters in the large CV")
    parser.add_argument("--gets", type=int, default=100, help="GETs of the large CV")
    args = parser.parse_args(argv)
    from kubernetes import client as k8s  # noqa: PLC0415
    from kubernetes.config import new_client_from_config  # noqa: PLC0415

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs", flush=True)
    with _plane() as (kubeconfig, pids):
        with new_client_from_config(config_file=str(kubeconfig)) as admin:
            k8s.CoreV1Api(admin).create_namespace(
                k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="bench"))
            )
        kube = KubeClient(str(kubeconfig))
        try:
            watched = _writes(kube, pids, args.objects, args.writes, args.writers, watch=True)
            print(_row(f"{args.writes} ClusterUpgrade status writes, watched", watched))
            quiet = _writes(kube, pids, args.objects, args.writes, args.writers, watch=False)
            print(_row(f"{args.writes} ClusterUpgrade status writes, no watch", quiet))
            large = _gets(kube, pids, args.cv_clusters, args.gets)
            print(
                _row(f"{args.gets} GETs of a ClusterVersion of {args.cv_clusters} clusters", large)
            )
        finally:
            kube.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
