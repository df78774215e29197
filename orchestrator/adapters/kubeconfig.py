"""Where the apiserver is and how to prove who we are: in-cluster or from a kubeconfig, read
here without the `kubernetes` package (its `__init__` imports its kubeconfig loader, and that
loader imports oauthlib, requests, google.auth and cryptography: about 19 MiB of a replica's
memory, whatever part of it is used).

Handled here, as client-go reads them
(https://kubernetes.io/docs/reference/config-api/kubeconfig.v1/):
- in-cluster: KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT, the service account's token
  file (read again when it changes: the kubelet rotates it) and its ca.crt;
- a kubeconfig (a path, or several joined by the path separator as in KUBECONFIG: the first
  file to name a cluster, user or context, or to set current-context, wins), its
  current-context or a named one; the cluster's server, certificate-authority(-data),
  insecure-skip-tls-verify, tls-server-name and proxy-url; the user's token, tokenFile (read
  again when it changes), client-certificate(-data), client-key(-data), username/password.
  Relative paths are relative to the kubeconfig's directory.
A user that needs an `exec` credential plugin or an `auth-provider` is handed to the
`kubernetes` package's loader, imported only then (`_generated`).

No credential is ever put in a log line or an error message.
"""
# mypy: disable-error-code="no-untyped-call"
# (the kubernetes loader of the exec / auth-provider fallback is untyped)

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CREDENTIAL_CHECK_SECONDS",
    "Connection",
    "Credentials",
    "KubeConfigError",
    "connection",
]

#: How often a credential that can change (a token file, an exec plugin's expiring token) is
#: looked at again at most. A 401 looks at once.
CREDENTIAL_CHECK_SECONDS = 10.0
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = "~/.kube/config"


class KubeConfigError(ValueError):
    """The apiserver's address or credentials cannot be read (says which field and what to do;
    never the credential itself)."""


@dataclass(frozen=True)
class Connection:
    """Where the apiserver is, its TLS settings (None: plain HTTP) and our credentials."""

    host: str  # scheme://host[:port], no trailing slash
    tls: ssl.SSLContext | None
    server_hostname: str | None  # tls-server-name: the name the certificate is checked for
    proxy: str | None
    credentials: Credentials


class Credentials:
    """The Authorization header of every request, built once and again only when the
    credential changes.

    `source` says the credential: (scheme, value) with scheme "Bearer" or "Basic", or None for
    none (a client certificate is not a header: it is in the TLS settings). It is asked at most
    every CREDENTIAL_CHECK_SECONDS, or at once after a 401 (`refreshed`).
    """

    def __init__(self, source: Callable[[], tuple[str, str] | None]) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._checked = -float("inf")
        self._key: object = object()  # no credential seen yet
        self._headers: dict[str, str] = {}

    def _check(self, force: bool) -> None:
        with self._lock:
            now = time.monotonic()
            if not force and now - self._checked < CREDENTIAL_CHECK_SECONDS:
                return
            key = self._source()
            if key != self._key:
                self._key = key
                self._headers = {} if key is None else {"Authorization": f"{key[0]} {key[1]}"}
            # Marked checked only once the headers say what was read: a thread that finds it
            # checked reads them as they are now. Marked first, a thread asking while the
            # first read was under way sent its request with no credential at all (a CI run:
            # a replica's first watches refused as system:anonymous).
            self._checked = now

    def headers(self) -> dict[str, str]:
        """The auth headers (possibly none): the same dict until the credential changes."""
        if time.monotonic() - self._checked >= CREDENTIAL_CHECK_SECONDS:
            self._check(force=False)
        return self._headers

    def refreshed(self) -> bool:
        """Ask for the credential now (after a 401); True when it changed."""
        before = self._headers
        self._check(force=True)
        return self._headers is not before


def _token_file(path: Path, field: str) -> Callable[[], tuple[str, str] | None]:
    """A bearer token read from path each time it is asked (the caller throttles)."""

    def read() -> tuple[str, str] | None:
        try:
            token = path.read_text().strip()
        except OSError as err:
            raise KubeConfigError(
                f"{field}: cannot read the token file {path} ({err.strerror}); "
                "mount it or point the field at the file"
            ) from None
        return ("Bearer", token) if token else None

    return read


def _tls(
    ca_file: str | None,
    ca_data: bytes | None,
    cert: tuple[str | None, bytes | None],
    key: tuple[str | None, bytes | None],
    verify: bool,
    where: str,
) -> ssl.SSLContext:
    """The TLS settings: the CA (system roots when none is given), the client certificate and
    key (read once; given as data, through a private file removed at once), verification."""
    try:
        ctx = ssl.create_default_context(
            cafile=ca_file or None, cadata=ca_data.decode("ascii") if ca_data else None
        )
    except (OSError, ssl.SSLError, UnicodeDecodeError, ValueError) as err:
        raise KubeConfigError(
            f"{where}certificate-authority(-data): not a readable PEM CA certificate "
            f"({type(err).__name__}); point it at the apiserver's CA"
        ) from None
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    (cert_file, cert_data), (key_file, key_data) = cert, key
    if bool(cert_file or cert_data) != bool(key_file or key_data):
        raise KubeConfigError(
            f"{where}client-certificate(-data) and client-key(-data) go together; give both"
        )
    if cert_file or cert_data:
        with tempfile.TemporaryDirectory(prefix="fleet-kube-") as tmp:
            if cert_data:
                cert_file = os.path.join(tmp, "client.crt")
                Path(cert_file).write_bytes(cert_data)
            if key_data:
                key_file = os.path.join(tmp, "client.key")
                Path(key_file).write_bytes(key_data)
            try:
                ctx.load_cert_chain(str(cert_file), str(key_file))
            except (OSError, ssl.SSLError) as err:
                raise KubeConfigError(
                    f"{where}client-certificate(-data)/client-key(-data): not a readable PEM "
                    f"certificate and matching key ({type(err).__name__})"
                ) from None
    return ctx


def _in_cluster() -> Connection:
    """The service account's view: the apiserver's Service and the mounted token and CA."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    if ":" in host:  # IPv6
        host = f"[{host}]"
    ca = SERVICE_ACCOUNT_DIR / "ca.crt"
    tls = _tls(str(ca), None, (None, None), (None, None), True, "in-cluster ")
    token = _token_file(SERVICE_ACCOUNT_DIR / "token", "in-cluster service account token")
    return Connection(f"https://{host}:{port}", tls, None, None, Credentials(token))


def _named(doc: Mapping[str, Any], section: str, name: str, path: str) -> Mapping[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            body = entry.get(section[:-1])
            return body if isinstance(body, Mapping) else {}
    raise KubeConfigError(f"{path}: no {section[:-1]} named {name!r} in {section}")


def _merged(paths: list[str]) -> tuple[dict[str, Any], dict[str, Path]]:
    """The kubeconfig files as one: the first to name an entry or set current-context wins
    (client-go's rule); with the directory each entry's relative paths are relative to."""
    merged: dict[str, Any] = {"clusters": [], "users": [], "contexts": []}
    home: dict[str, Path] = {}
    seen: set[tuple[str, str]] = set()
    for name in paths:
        path = Path(name).expanduser()
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except OSError as err:
            if len(paths) > 1 and not path.exists():
                continue  # KUBECONFIG may list files that do not exist
            raise KubeConfigError(
                f"kubeconfig {path}: cannot read it ({err.strerror}); "
                "give --kubeconfig a readable file"
            ) from None
        except yaml.YAMLError:
            raise KubeConfigError(f"kubeconfig {path}: not YAML") from None
        if not isinstance(doc, Mapping):
            raise KubeConfigError(f"kubeconfig {path}: not a kubeconfig (a YAML mapping)")
        if not merged.get("current-context"):
            merged["current-context"] = doc.get("current-context") or None
        for section in ("clusters", "users", "contexts"):
            for entry in doc.get(section) or []:
                if not isinstance(entry, Mapping) or (section, entry.get("name")) in seen:
                    continue
                seen.add((section, str(entry.get("name"))))
                merged[section].append(entry)
                home[f"{section}/{entry.get('name')}"] = path.parent
    if not any(merged[s] for s in ("clusters", "users", "contexts")):
        raise KubeConfigError(
            f"kubeconfig {os.pathsep.join(paths)}: no clusters, users or contexts"
        )
    return merged, home


def _data(entry: Mapping[str, Any], field: str, where: str) -> bytes | None:
    raw = entry.get(f"{field}-data")
    if not raw:
        return None
    try:
        return base64.b64decode(str(raw), validate=True)
    except ValueError:
        raise KubeConfigError(f"{where}{field}-data: not base64") from None


def _file(entry: Mapping[str, Any], field: str, base: Path) -> str | None:
    raw = entry.get(field)
    if not raw:
        return None
    return str((base / Path(str(raw)).expanduser()).resolve())


def _from_kubeconfig(paths: list[str], context: str | None) -> Connection:
    doc, home = _merged(paths)
    shown = os.pathsep.join(paths)
    name = context or doc.get("current-context")
    if not name:
        raise KubeConfigError(f"kubeconfig {shown}: no current-context; set one or name a context")
    ctx = _named(doc, "contexts", str(name), f"kubeconfig {shown}")
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if not cluster_name:
        raise KubeConfigError(f"kubeconfig {shown}: context {name!r} names no cluster")
    cluster = _named(doc, "clusters", str(cluster_name), f"kubeconfig {shown}")
    user = _named(doc, "users", str(user_name), f"kubeconfig {shown}") if user_name else {}
    if user.get("exec") or user.get("auth-provider"):
        return _generated(paths, context)
    where = f"kubeconfig {shown}: cluster {cluster_name!r}: "
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"{where}server: not an http(s) URL; set it to the apiserver's URL")
    base = home[f"clusters/{cluster_name}"]
    user_base = home.get(f"users/{user_name}", base)
    user_where = f"kubeconfig {shown}: user {user_name!r}: "
    tls = None
    if server.startswith("https://"):
        tls = _tls(
            _file(cluster, "certificate-authority", base),
            _data(cluster, "certificate-authority", where),
            (
                _file(user, "client-certificate", user_base),
                _data(user, "client-certificate", user_where),
            ),
            (_file(user, "client-key", user_base), _data(user, "client-key", user_where)),
            not cluster.get("insecure-skip-tls-verify"),
            where,
        )
    return Connection(
        server,
        tls,
        str(cluster.get("tls-server-name") or "") or None,
        str(cluster.get("proxy-url") or "") or None,
        _user_credentials(user, user_base, user_where),
    )


def _user_credentials(user: Mapping[str, Any], base: Path, where: str) -> Credentials:
    """token, else tokenFile (read again when it changes), else username/password, else none
    (a client certificate, in the TLS settings)."""
    token = str(user.get("token") or "")
    if token:
        return Credentials(lambda: ("Bearer", token))
    token_file = _file(user, "tokenFile", base)
    if token_file:
        return Credentials(_token_file(Path(token_file), f"{where}tokenFile"))
    if user.get("username") or user.get("password"):
        pair = f"{user.get('username') or ''}:{user.get('password') or ''}".encode()
        basic = base64.b64encode(pair).decode()
        return Credentials(lambda: ("Basic", basic))
    return Credentials(lambda: None)


def _generated(paths: list[str], context: str | None) -> Connection:
    """A user with an exec credential plugin or an auth-provider: the kubernetes package's own
    loader (imported only here), asked at most every CREDENTIAL_CHECK_SECONDS (its refresh hook
    runs the plugin when the token expired) and at once after a 401."""
    from kubernetes import client, config  # noqa: PLC0415

    cfg = client.Configuration()
    config.load_kube_config(
        config_file=os.pathsep.join(paths), context=context, client_configuration=cfg
    )

    def source() -> tuple[str, str] | None:
        hook = cfg.refresh_api_key_hook
        if hook is not None:
            hook(cfg)
        value = cfg.api_key.get("BearerToken") or cfg.api_key.get("authorization")
        if not value:
            return None
        kind, _, token = str(value).partition(" ")
        return (kind, token) if token else ("Bearer", kind)

    tls = None
    if cfg.host.startswith("https://"):
        tls = _tls(
            cfg.ssl_ca_cert,
            None,
            (cfg.cert_file, None),
            (cfg.key_file, None),
            bool(cfg.verify_ssl),
            "kubeconfig: ",
        )
    return Connection(
        cfg.host.rstrip("/"),
        tls,
        getattr(cfg, "tls_server_name", None) or None,
        cfg.proxy or None,
        Credentials(source),
    )


def connection(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """The apiserver and our credentials: from kubeconfig (a path, or paths joined by the path
    separator) when given; else in-cluster when running in a pod; else KUBECONFIG's files or
    ~/.kube/config."""
    if kubeconfig:
        return _from_kubeconfig(kubeconfig.split(os.pathsep), context)
    if (
        os.environ.get("KUBERNETES_SERVICE_HOST")
        and os.environ.get("KUBERNETES_SERVICE_PORT")
        and (SERVICE_ACCOUNT_DIR / "token").is_file()
    ):
        return _in_cluster()
    default = os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    return _from_kubeconfig(default.split(os.pathsep), context)
