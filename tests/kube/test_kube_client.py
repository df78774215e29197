"""orchestrator.adapters.kube's lean HTTP path against the real apiserver (issue 21): watches
decoded from the raw stream (every event type, the server's own end, 410 Gone, stopping early),
conditional status writes (409), the credential read once and again only after a 401, and the
cache keeping no managedFields and freezing its objects out of the collector."""

from __future__ import annotations

import gc
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import api
from orchestrator.adapters.cache import ObjectCache
from orchestrator.adapters.kube import Conflict, Gone, KubeClient, KubeError, NotFound
from tests.support.kube import KubeCluster, wait_for

CU = api.CLUSTER_UPGRADE_PLURAL
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def upgrade_body(name: str, run: str = "some-run") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.CLUSTER_UPGRADE_KIND,
        "metadata": {
            "name": name,
            "labels": {api.LABEL_RUN: run},
            "annotations": {LAST_APPLIED: '{"spec": "as applied"}', "kept": "yes"},
        },
        "spec": {
            "clusterId": "cluster-00",
            "stage": "default",
            "stageIndex": 0,
            "version": "1.29.1",
            "nodeVersion": "1.29.1",
            "provider": "127.0.0.1:1",
        },
    }


@pytest.fixture
def kube(control_plane: KubeCluster) -> Iterator[KubeClient]:
    client = KubeClient(str(control_plane.kubeconfig))
    try:
        yield client
    finally:
        client.close()


def test_a_watch_sees_each_change_in_order_and_ends_when_the_server_ends_it(
    kube: KubeClient, namespace: str
) -> None:
    _, rv = kube.list_objects(CU, namespace)
    made = kube.create_object(CU, namespace, upgrade_body("cu"))
    written = kube.write_status(
        CU, namespace, "cu", {"phase": "ServicingOut"}, made["metadata"]["resourceVersion"]
    )
    kube.delete_object(CU, namespace, "cu")
    started = time.monotonic()
    events = list(kube.watch_objects(CU, namespace, rv, timeout_seconds=2))
    # The server ended the watch after its timeout; nothing was left half-read.
    assert time.monotonic() - started < 20
    changes = [(e.type, e.obj["metadata"]["name"]) for e in events if e.type != "BOOKMARK"]
    assert changes == [("ADDED", "cu"), ("MODIFIED", "cu"), ("DELETED", "cu")]
    modified = next(e.obj for e in events if e.type == "MODIFIED")
    assert modified["status"] == {"phase": "ServicingOut"}
    assert modified["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
    assert modified["spec"] == made["spec"]
    with pytest.raises(NotFound):
        kube.get_object(CU, namespace, "cu")


def test_a_watch_across_namespaces_stopped_early_leaves_the_client_usable(
    kube: KubeClient, namespace: str
) -> None:
    _, rv = kube.list_objects(CU, None)
    kube.create_object(CU, namespace, upgrade_body("first"))
    kube.create_object(CU, namespace, upgrade_body("second"))
    watch = kube.watch_objects(CU, None, rv, timeout_seconds=60)
    first = next(e for e in watch if e.type == "ADDED")
    assert (first.obj["metadata"]["namespace"], first.obj["metadata"]["name"]) == (
        namespace,
        "first",
    )
    watch.close()  # the stream is dropped, not handed back to the pool half-read
    for _ in range(3):
        items, _ = kube.list_objects(CU, namespace, label_selector=f"{api.LABEL_RUN}=some-run")
        assert sorted(o["metadata"]["name"] for o in items) == ["first", "second"]
    assert kube.list_objects(CU, namespace, label_selector=f"{api.LABEL_RUN}=other")[0] == []


def test_a_watch_from_a_resource_version_too_old_raises_gone(
    kube: KubeClient, namespace: str
) -> None:
    with pytest.raises(Gone) as gone:
        for _ in kube.watch_objects(CU, namespace, "1", timeout_seconds=5):
            pass
    assert gone.value.status == 410


def test_a_status_write_from_a_stale_resource_version_conflicts(
    kube: KubeClient, namespace: str
) -> None:
    made = kube.create_object(CU, namespace, upgrade_body("cu"))
    stale = made["metadata"]["resourceVersion"]
    kube.write_status(CU, namespace, "cu", {"phase": "ServicingOut"}, stale)
    with pytest.raises(Conflict) as conflict:
        kube.write_status(CU, namespace, "cu", {"phase": "Failed"}, stale)
    assert conflict.value.status == 409
    assert kube.get_object(CU, namespace, "cu")["status"] == {"phase": "ServicingOut"}
    with pytest.raises(Conflict):
        kube.create_object(CU, namespace, upgrade_body("cu"))


def test_a_status_write_goes_out_in_one_tls_write_and_lands_whatever_its_size(
    kube: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = threading.get_ident()
    writes: list[int] = []
    real = ssl.SSLSocket.sendall

    def counted(sock: ssl.SSLSocket, data: Any, flags: int = 0) -> None:
        if threading.get_ident() == me:
            writes.append(len(data))
        real(sock, data, flags)

    kube.create_object(CU, namespace, upgrade_body("cu"))
    version = kube.get_object(CU, namespace, "cu")["metadata"]["resourceVersion"]
    monkeypatch.setattr(ssl.SSLSocket, "sendall", counted)
    small = {"phase": "ServicingOut", "message": "taken out of service"}
    version = kube.write_status(CU, namespace, "cu", small, version)["metadata"]["resourceVersion"]
    # The head and the ~200-byte patch in one TLS write (urllib3 alone makes two).
    assert len(writes) == 1 and writes[0] > 200
    writes.clear()
    large = {"phase": "Verifying", "message": "x" * 40_000}
    kube.write_status(CU, namespace, "cu", large, version)
    assert len(writes) >= 2  # past one write's size: as urllib3 sends it
    monkeypatch.undo()
    # Both landed, whole, and a stale one still conflicts.
    assert kube.get_object(CU, namespace, "cu")["status"] == large
    with pytest.raises(Conflict):
        kube.write_status(CU, namespace, "cu", small, version)
    assert kube.get_object(CU, namespace, "cu")["status"] == large


#: A client-go exec credential plugin: prints the token in TOKEN_FILE, already expired (so the
#: kubernetes client's loader runs it again whenever its refresh hook is asked), and counts
#: its runs in COUNT_FILE.
EXEC_PLUGIN = """
import json, pathlib, sys
token, count = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with count.open("a") as f:
    f.write("run\\n")
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1beta1",
    "kind": "ExecCredential",
    "status": {"token": token.read_text().strip(), "expirationTimestamp": "2000-01-01T00:00:00Z"},
}))
"""


def _exec_kubeconfig(control_plane: KubeCluster, tmp_path: Path) -> tuple[Path, Path, Path]:
    config = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    admin_token = config["users"][0]["user"]["token"]
    token, count, plugin = tmp_path / "token", tmp_path / "runs", tmp_path / "plugin.py"
    token.write_text("not-the-token\n")
    plugin.write_text(EXEC_PLUGIN)
    config["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin), str(token), str(count)],
            "interactiveMode": "Never",
        }
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    (tmp_path / "admin-token").write_text(admin_token)
    return path, token, count


def _runs(count: Path) -> int:
    return len(count.read_text().splitlines()) if count.exists() else 0


def test_the_credential_is_fetched_once_and_again_only_when_the_server_refuses_it(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    kubeconfig, token, count = _exec_kubeconfig(control_plane, tmp_path)
    kube = KubeClient(str(kubeconfig))
    try:
        # A wrong credential: the 401 asks the plugin again at once; still wrong, it is said.
        with pytest.raises(KubeError) as refused:
            kube.list_objects(CU, namespace)
        assert refused.value.status == 401
        runs_after_refusal = _runs(count)
        # The credential rotates; the next request's 401 fetches it and is sent again.
        token.write_text((tmp_path / "admin-token").read_text())
        assert kube.list_objects(CU, namespace)[0] == []
        assert _runs(count) == runs_after_refusal + 1
        before = _runs(count)
        started = time.monotonic()
        kube.create_object(CU, namespace, upgrade_body("cu"))
        for i in range(30):
            obj = kube.get_object(CU, namespace, "cu")
            kube.write_status(
                CU,
                namespace,
                "cu",
                {"phase": "Verifying", "message": f"pass {i}"},
                obj["metadata"]["resourceVersion"],
            )
        assert kube.get_lease(namespace, "nobody") is None  # the generated client's path too
        elapsed = time.monotonic() - started
        assert kube.get_object(CU, namespace, "cu")["status"]["message"] == "pass 29"
        # 62 requests; the expired credential was asked for again at most once per check
        # period (the kubernetes client's own hook ran the plugin before every request).
        assert _runs(count) - before <= 1 + int(elapsed // 10)
    finally:
        kube.close()


def test_the_cache_keeps_no_managed_fields_and_freezes_what_it_listed(
    kube: KubeClient, namespace: str
) -> None:
    kube.create_object(CU, namespace, upgrade_body("listed"))
    on_server = kube.get_object(CU, namespace, "listed")
    assert on_server["metadata"]["managedFields"]
    assert LAST_APPLIED in on_server["metadata"]["annotations"]
    cache = ObjectCache(kube, CU, None, api.LABEL_RUN)
    stop = threading.Event()
    frozen_before = gc.get_freeze_count()
    watcher = threading.Thread(target=cache.run, args=(stop,), daemon=True)
    watcher.start()
    try:
        assert cache.synced.wait(30)
        assert gc.get_freeze_count() > frozen_before  # the listed objects left the collector
        kube.create_object(CU, namespace, upgrade_body("watched"))
        watched = wait_for("the watch's copy", lambda: cache.get(namespace, "watched"))
        obj = kube.get_object(CU, namespace, "listed")
        written = kube.write_status(
            CU, namespace, "listed", {"phase": "Verifying"}, obj["metadata"]["resourceVersion"]
        )
        cache.put(written)  # write-through (the watch's echo may have come first)
        assert "managedFields" not in written["metadata"]
        wait_for(
            "the written version cached",
            lambda: (
                (cache.get(namespace, "listed") or {}).get("metadata", {}).get("resourceVersion")
                == written["metadata"]["resourceVersion"]
            ),
        )
        for cached in (cache.get(namespace, "listed"), watched):
            assert cached is not None
            meta = cached["metadata"]
            assert "managedFields" not in meta
            assert meta["annotations"] == {"kept": "yes"}
            assert meta["labels"] == {api.LABEL_RUN: "some-run"}
            assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]
            assert cached["spec"] == on_server["spec"]
        assert cache.get(namespace, "listed")["status"] == {"phase": "Verifying"}  # type:
        # ignore[index]
        names = {o["metadata"]["name"] for o in cache.by_label(namespace, "some-run")}
        assert names == {"listed", "watched"}
    finally:
        stop.set()
        kube.create_object(CU, namespace, upgrade_body("wake"))  # the watch looks at stop
        watcher.join(timeout=70)
    assert not watcher.is_alive()


def test_close_closes_every_pooled_connection(control_plane: KubeCluster) -> None:
    """close() releases the apiserver connections it pooled, not only the generated client's
    threads: their sockets are closed now, not by the garbage collector whenever it runs (a
    ResourceWarning in whichever test's teardown that happens to be)."""
    kube = KubeClient(str(control_plane.kubeconfig))
    _, version = kube.list_objects(api.PLURAL, "default")
    assert kube._wire is not None
    kept = kube._wire.idle_sockets()  # requests answered whole: the client's own connections
    assert kept, "a connection was kept"
    # A watch the server ends gives its connection back to urllib3's pool.
    assert list(kube.watch_objects(api.PLURAL, "default", version, 1)) == []
    pool = kube._pool
    assert pool is not None and pool.num_connections >= 1
    idle = list(pool.pool.queue) if pool.pool is not None else []
    opened = [c for c in idle if c is not None and c.sock is not None]
    assert opened, "a connection was pooled"
    kube.close()
    assert pool.pool is None
    assert all(c.sock is None for c in opened)
    assert all(sock.fileno() == -1 for sock in kept)  # closed
    assert kube._wire.idle_sockets() == []


def test_the_echo_of_our_own_status_write_wakes_nobody_whichever_comes_first(
    kube: KubeClient, namespace: str
) -> None:
    """Issue 21: a third of a rollout's passes looked at nothing new. The watch's echo of a
    status write of ours often came before the write's answer was put in the cache, so it was
    news and woke the run, which had already decided on it. A write made through
    `ObjectCache.writing` holds back what the watch says of that object until its answer is
    in: the echo (the answer's own version) wakes nobody; anything else still does."""
    woken: list[str] = []
    cache = ObjectCache(
        kube, CU, None, api.LABEL_RUN, lambda t, o: woken.append(o["metadata"]["name"]), True
    )
    stop = threading.Event()
    watcher = threading.Thread(target=cache.run, args=(stop,), daemon=True)
    watcher.start()
    try:
        assert cache.synced.wait(30)
        names = [f"echo-{i}" for i in range(5)]
        for name in names:
            kube.create_object(CU, namespace, upgrade_body(name))
        wait_for("created ones cached", lambda: all(cache.get(namespace, n) for n in names))
        wait_for("their creations seen", lambda: set(woken) == set(names))
        woken.clear()
        last: dict[str, str] = {}
        for i in range(40):
            name = names[i % len(names)]
            obj = cache.get(namespace, name)
            assert obj is not None
            with cache.writing(namespace, name):
                written = kube.write_status(
                    CU,
                    namespace,
                    name,
                    {"phase": "Verifying", "message": f"write {i}"},
                    obj["metadata"]["resourceVersion"],
                )
                cache.put(written, own=True)
            last[name] = written["metadata"]["resourceVersion"]
        # Someone else's write to one of them, after ours: that is news.
        other = cache.get(namespace, names[0])
        assert other is not None
        kube.write_status(
            CU, namespace, names[0], {"phase": "Failed"}, other["metadata"]["resourceVersion"]
        )
        wait_for("the other writer's change seen", lambda: woken == [names[0]], timeout=10)
        time.sleep(0.5)  # any late echo would wake now
        assert woken == [names[0]]
        for name in names[1:]:
            cached = cache.get(namespace, name)
            assert cached is not None and cached["metadata"]["resourceVersion"] == last[name]
    finally:
        stop.set()
        kube.create_object(CU, namespace, upgrade_body("wake"))  # the watch looks at stop
        watcher.join(timeout=70)
    assert not watcher.is_alive()
