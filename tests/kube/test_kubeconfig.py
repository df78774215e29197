"""orchestrator.adapters.kubeconfig against the real apiserver (issue 21): `run` reaches the
apiserver without the `kubernetes` package; in-cluster and kubeconfig credentials (inline CA,
token files read again when they rotate, named contexts, tls-server-name, skipping
verification) work as client-go's, and a kubeconfig that cannot work says which field and
never the credential."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from urllib3.exceptions import InsecureRequestWarning

from orchestrator import api
from orchestrator.adapters import kubeconfig
from orchestrator.adapters.kube import KubeClient, KubeError
from orchestrator.adapters.kubeconfig import KubeConfigError
from tests.kube.test_kube_client import CU, upgrade_body
from tests.support.kube import KubeCluster

#: What `run` imports (benchmarks.bench_memory.RUN_IMPORTS), then the adapter built from a
#: kubeconfig and used: a list, a Lease read, a status write.
_PROBE = """
import json, sys
import orchestrator.cli, orchestrator.controllers.manager
from orchestrator.adapters.kube import KubeClient
kube = KubeClient(sys.argv[1])
namespace = sys.argv[2]
made = kube.create_object("clusterupgrades", namespace, json.loads(sys.argv[3]))
kube.write_status("clusterupgrades", namespace, made["metadata"]["name"], {"phase": "Verifying"},
                  made["metadata"]["resourceVersion"])
listed, _ = kube.list_objects("clusterupgrades", namespace)
lease = kube.get_lease(namespace, "nobody")
kube.close()
print(json.dumps({
    "listed": [o["metadata"]["name"] for o in listed],
    "lease": lease,
    "loaded": sorted(m for m in sys.modules
                     if m.split(".")[0] in ("kubernetes", "requests", "oauthlib")
                     or m.startswith("google.auth")),
}))
"""


@contextmanager
def _client(path: str | None, context: str | None = None) -> Iterator[KubeClient]:
    """A client of the adapter from a kubeconfig (None: in-cluster), closed after."""
    kube = KubeClient(path, context=context)
    try:
        yield kube
    finally:
        kube.close()


def test_run_reaches_the_apiserver_without_the_kubernetes_package(
    control_plane: KubeCluster, namespace: str
) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _PROBE,
            str(control_plane.kubeconfig),
            namespace,
            json.dumps(upgrade_body("probe")),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    result = json.loads(out)
    assert result == {"listed": ["probe"], "lease": None, "loaded": []}
    with _client(str(control_plane.kubeconfig)) as kube:
        assert kube.get_object(CU, namespace, "probe")["status"] == {"phase": "Verifying"}


def _admin(control_plane: KubeCluster) -> tuple[str, str, str]:
    """The control plane's admin token, its server URL and its CA file."""
    config = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    cluster = config["clusters"][0]["cluster"]
    return config["users"][0]["user"]["token"], cluster["server"], cluster["certificate-authority"]


def _write(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _one(
    server: str, cluster: dict[str, Any], user: dict[str, Any], name: str = "ctx"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": server, **cluster}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }


def test_a_named_context_with_an_inline_ca_and_a_token_file_read_again_when_it_rotates(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    token, server, ca = _admin(control_plane)
    ca_data = base64.b64encode(Path(ca).read_bytes()).decode()
    (tmp_path / "token").write_text("not-the-token\n")
    doc = _one(server, {"certificate-authority-data": ca_data}, {"tokenFile": "token"}, "good")
    # The current context points nowhere: the named one is used.
    doc["clusters"].append({"name": "bad", "cluster": {"server": "https://127.0.0.1:1"}})
    doc["users"].append({"name": "bad", "user": {"token": "x"}})
    doc["contexts"].append({"name": "bad", "context": {"cluster": "bad", "user": "bad"}})
    doc["current-context"] = "bad"
    path = _write(tmp_path / "kubeconfig", doc)
    with _client(path, context="good") as kube:
        with pytest.raises(KubeError) as refused:
            kube.list_objects(CU, namespace)
        assert refused.value.status == 401
        assert "not-the-token" not in str(refused.value)
        # The kubelet (or an operator) rotates the file; the next 401 reads it again.
        (tmp_path / "token").write_text(token + "\n")
        kube.create_object(CU, namespace, upgrade_body("rotated"))
        assert [o["metadata"]["name"] for o in kube.list_objects(CU, namespace)[0]] == ["rotated"]


def test_tls_server_name_is_the_name_the_certificate_is_checked_for(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    token, server, ca = _admin(control_plane)
    good = _one(
        server,
        {"certificate-authority": ca, "tls-server-name": "kubernetes.default.svc"},
        {"token": token},
    )
    with _client(_write(tmp_path / "good", good)) as kube:
        assert kube.list_objects(CU, namespace)[0] == []
    wrong = _one(
        server,
        {"certificate-authority": ca, "tls-server-name": "not-the-apiserver.example"},
        {"token": token},
    )
    with _client(_write(tmp_path / "wrong", wrong)) as kube:
        with pytest.raises(KubeError) as refused:
            kube.list_objects(CU, namespace)
        assert refused.value.status == 0 and "not-the-apiserver.example" in str(refused.value)
        assert token not in str(refused.value)


def test_without_its_ca_the_server_is_refused_unless_verification_is_skipped(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    token, server, _ = _admin(control_plane)
    with _client(_write(tmp_path / "no-ca", _one(server, {}, {"token": token}))) as unverified:
        with pytest.raises(KubeError) as refused:
            unverified.list_objects(CU, namespace)
        assert refused.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    doc = _one(server, {"insecure-skip-tls-verify": True}, {"token": token})
    # urllib3 warns of the unverified request, as it did before.
    with (
        _client(_write(tmp_path / "insecure", doc)) as skipping,
        pytest.warns(InsecureRequestWarning),
    ):
        skipping.create_object(CU, namespace, upgrade_body("unverified"))
        assert skipping.get_object(CU, namespace, "unverified")["spec"]["clusterId"]


def test_in_cluster_the_service_account_token_and_ca_are_used_and_the_token_reread(
    control_plane: KubeCluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token, server, ca = _admin(control_plane)
    host, _, port = server.removeprefix("https://").rpartition(":")
    mounted = tmp_path / "serviceaccount"
    mounted.mkdir()
    (mounted / "ca.crt").write_bytes(Path(ca).read_bytes())
    (mounted / "token").write_text("expired-token")
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", mounted)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with _client(None) as kube:
        with pytest.raises(KubeError) as refused:
            kube.list_objects(CU, namespace)
        assert refused.value.status == 401
        (mounted / "token").write_text(token)
        kube.create_object(CU, namespace, upgrade_body("in-cluster"))
        assert kube.get_object(CU, namespace, "in-cluster")["metadata"]["name"] == "in-cluster"


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d.update({"current-context": "elsewhere"}), "no context named 'elsewhere'"),
        (lambda d: d.pop("current-context"), "no current-context"),
        (lambda d: d["clusters"][0]["cluster"].update(server="127.0.0.1:6443"), "server"),
        (
            lambda d: d["clusters"][0]["cluster"].update({"certificate-authority-data": "%%"}),
            "certificate-authority-data: not base64",
        ),
        (
            lambda d: d["clusters"][0]["cluster"].update({"certificate-authority": "absent.crt"}),
            "certificate-authority(-data)",
        ),
        (
            lambda d: d["users"][0]["user"].update({"client-certificate-data": "c2VjcmV0"}),
            "client-certificate(-data) and client-key(-data) go together",
        ),
    ],
)
def test_a_kubeconfig_that_cannot_work_names_the_field_and_not_the_credential(
    tmp_path: Path, edit: Any, says: str
) -> None:
    doc = _one("https://127.0.0.1:6443", {}, {"token": "s3cret-token"})
    edit(doc)
    with pytest.raises(KubeConfigError) as bad:
        KubeClient(_write(tmp_path / "kubeconfig", doc))
    assert says in str(bad.value)
    assert "s3cret-token" not in str(bad.value) and "c2VjcmV0" not in str(bad.value)


def test_a_missing_kubeconfig_file_is_said(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="cannot read it"):
        KubeClient(str(tmp_path / "absent"))


def test_files_listed_in_kubeconfig_merge_the_first_naming_an_entry_wins(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    token, server, ca = _admin(control_plane)
    first = _one(server, {"certificate-authority": ca}, {"token": token})
    second = _one("https://127.0.0.1:1", {}, {"token": "other"})
    second["current-context"] = "other"
    paths = [_write(tmp_path / "first", first), _write(tmp_path / "second", second)]
    with _client(":".join([*paths, str(tmp_path / "absent")])) as kube:
        assert kube.list_objects(api.CLUSTER_UPGRADE_PLURAL, namespace)[0] == []


def test_a_request_made_while_the_credential_is_first_read_carries_it() -> None:
    """Threads that start at once (an orchestrator's watches) all send the credential. Before,
    the credential was marked checked before it was read: a thread asking while the first
    read was under way got the headers of no credential, and its request went as
    system:anonymous (a CI run: one replica's first watches of FleetProviders and
    MetricSources refused so). A slow source makes the window wide."""
    reading = threading.Event()

    def slow_source() -> tuple[str, str]:
        reading.set()
        time.sleep(0.3)
        return ("Bearer", "t0ken")

    credentials = kubeconfig.Credentials(slow_source)
    seen: list[dict[str, str]] = []
    first = threading.Thread(target=lambda: seen.append(credentials.headers()))
    first.start()
    assert reading.wait(5)
    seen.append(credentials.headers())  # asked while the first read is under way
    first.join(5)
    assert seen == [{"Authorization": "Bearer t0ken"}] * 2
