"""kubectl against a test apiserver: apply (also server-side dry runs), kustomize, YAML docs."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support.kube import KubeCluster

__all__ = ["create_tls_secrets", "kubectl", "kustomize", "yaml_docs"]


def kubectl(
    cluster: KubeCluster, *args: str, stdin: str | None = None, timeout: float = 60.0
) -> str:
    """Run kubectl with the cluster's admin kubeconfig; its stdout, or AssertionError with both
    streams when it fails."""
    binary = shutil.which("kubectl")
    assert binary, "kubectl is not on PATH: apt-get install kubernetes-client"
    done = subprocess.run(
        [binary, "--kubeconfig", str(cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def create_tls_secrets(
    cluster: KubeCluster,
    namespace: str,
    ca_file: Path | str,
    client_cert_file: Path | str,
    client_key_file: Path | str,
    ca_secret: str = "plugin-ca",
    client_secret: str = "orchestrator-client",
) -> None:
    """The two Secrets a plugin endpoint's TLS names: the CA (generic, key ca.crt) and the
    orchestrator's client pair (kubernetes.io/tls)."""
    kubectl(
        cluster,
        *("-n", namespace, "create", "secret", "generic", ca_secret),
        f"--from-file=ca.crt={ca_file}",
    )
    kubectl(
        cluster,
        *("-n", namespace, "create", "secret", "tls", client_secret),
        f"--cert={client_cert_file}",
        f"--key={client_key_file}",
    )


def kustomize(directory: Path) -> str:
    """`kubectl kustomize DIR` (no apiserver needed); the rendered YAML."""
    binary = shutil.which("kubectl")
    assert binary, "kubectl is not on PATH: apt-get install kubernetes-client"
    done = subprocess.run(
        [binary, "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return done.stdout


def yaml_docs(text_or_paths: str | Sequence[Path]) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a text or of files."""
    texts = (
        [text_or_paths]
        if isinstance(text_or_paths, str)
        else [p.read_text() for p in text_or_paths]
    )
    return [d for t in texts for d in yaml.safe_load_all(t) if d]
