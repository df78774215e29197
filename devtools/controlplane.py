"""The local Kubernetes control plane: etcd and kube-apiservers on loopback, started and stopped.

One implementation serves both `scripts/dev-control-plane` (detached processes tracked by pid
files under `.dev/`) and the pytest fixtures in `tests/conftest.py` (child processes of the test
run that die with it). Standard library only, so the script also runs without the venv.

Every failure raises `ControlPlaneError(step, message)`; its text is one line naming the step
(apt, build, disk, port, keys, start, ...) and what to do about it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DEFAULT_DEV_DIR",
    "MAIN",
    "REPO_ROOT",
    "ApiServer",
    "ControlPlane",
    "ControlPlaneError",
    "ManagedProcess",
    "ensure_binaries",
    "find_binaries",
    "main",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-kube-apiserver"
DEFAULT_DEV_DIR = REPO_ROOT / ".dev"
#: Name of the first apiserver of a plane; it keeps the default etcd prefix (/registry).
MAIN = "main"
ADMIN_USER = "admin"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
_STATE_FILE = "control-plane.json"
_MIN_FREE_BYTES = 300 * 1024 * 1024
_PORT_ATTEMPTS = 3
_STOP_TIMEOUT = 15.0


class ControlPlaneError(Exception):
    """A step of starting or stopping the control plane failed; the text is one line."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"step {step}: {message}")
        self.step = step
        self.message = message


class _PortInUseError(Exception):
    """A process could not bind its port (another process took it between pick and bind)."""


# --------------------------------------------------------------------------------------------
# Binaries


def find_binaries() -> tuple[Path | None, Path | None]:
    """Return (kube-apiserver, etcd) paths where they exist, else None for each missing one.

    `FLEET_KUBE_APISERVER` and `FLEET_ETCD` override the defaults: the binary cached by
    scripts/build-kube-apiserver and the etcd on PATH.
    """
    override = os.environ.get("FLEET_KUBE_APISERVER")
    if override:
        apiserver = Path(override)
    else:
        result = subprocess.run(
            [str(BUILD_SCRIPT), "--print-path"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        apiserver = Path(result.stdout.strip()) if result.returncode == 0 else Path()
    etcd_text = os.environ.get("FLEET_ETCD") or shutil.which("etcd") or ""
    etcd = Path(etcd_text) if etcd_text else None
    return (
        apiserver if apiserver.name and os.access(apiserver, os.X_OK) else None,
        etcd if etcd is not None and os.access(etcd, os.X_OK) else None,
    )


def ensure_binaries() -> tuple[Path, Path]:
    """Return (kube-apiserver, etcd), running scripts/build-kube-apiserver first if either lacks.

    The build's progress streams to stderr; its failure line becomes this error's step.
    """
    apiserver, etcd = find_binaries()
    if apiserver is not None and etcd is not None and shutil.which("openssl"):
        return apiserver, etcd
    for variable, found in (("FLEET_KUBE_APISERVER", apiserver), ("FLEET_ETCD", etcd)):
        if os.environ.get(variable) and found is None:
            raise ControlPlaneError(
                "build", f"{variable}={os.environ[variable]} is not an executable file"
            )
    failure: ControlPlaneError | None = None
    with subprocess.Popen(
        [str(BUILD_SCRIPT)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as build:
        assert build.stderr is not None and build.stdout is not None
        for line in build.stderr:
            match = re.match(r"build-kube-apiserver: step ([a-z0-9-]+): (.*)", line.rstrip("\n"))
            if match:
                failure = ControlPlaneError(match.group(1), match.group(2))
            else:
                sys.stderr.write(line)
        out = build.stdout.read()
        code = build.wait()
    if code != 0:
        raise failure or ControlPlaneError(
            "build", f"{BUILD_SCRIPT.name} exited with code {code} (output above)"
        )
    apiserver, etcd = find_binaries()
    if apiserver is None:
        raise ControlPlaneError("build", f"{BUILD_SCRIPT.name} printed {out.strip()!r}, no binary")
    if etcd is None:
        raise ControlPlaneError("apt", "etcd is not on PATH; install the etcd-server package")
    return apiserver, etcd


# --------------------------------------------------------------------------------------------
# Processes


@dataclass
class ManagedProcess:
    """A process this module started, identified by pid and checked by its command line.

    `marker` (the plane's directory) must appear in the command line and `exe` must be its
    program name, so a recycled pid is never mistaken for ours.
    """

    name: str
    pid: int
    exe: str
    marker: str
    log: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        """Whether the process still runs (a zombie counts as gone)."""
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            argv = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
        return (
            bool(argv)
            and os.path.basename(argv[0].decode(errors="replace")) == self.exe
            and any(self.marker.encode() in arg for arg in argv)
        )

    def stop(self, timeout: float = _STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; returns once the process is gone."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self.alive():
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.popen is not None:
            self.popen.wait(timeout=timeout)
        if self.alive():
            raise ControlPlaneError("stop", f"{self.name} (pid {self.pid}) survived SIGKILL")

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the process's log, for error messages."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _spawn(name: str, argv: list[str], log: Path, marker: str, *, detach: bool) -> ManagedProcess:
    """Start argv with output to log; unless detached, it gets SIGTERM when this process dies."""
    setpriv = shutil.which("setpriv")
    command = argv if detach or setpriv is None else [setpriv, "--pdeathsig", "TERM", "--", *argv]
    with log.open("ab") as out:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    return ManagedProcess(name, popen.pid, Path(argv[0]).name, marker, log, popen)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(proc: ManagedProcess, ready: Callable[[], bool], timeout: float) -> None:
    """Poll `ready` until true; raise if the process exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            tail = proc.log_tail(20)
            if "address already in use" in tail:
                raise _PortInUseError(proc.name)
            last = tail.splitlines()[-1][:300] if tail else "no output"
            raise ControlPlaneError(
                "start", f"{proc.name} exited during start-up; log {proc.log}: {last}"
            )
        if ready():
            return
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                "start", f"{proc.name} not ready within {timeout:.0f}s; see its log {proc.log}"
            )
        time.sleep(0.1)


def _http_ok(url: str, *, token: str | None = None, ca_file: Path | None = None) -> bool:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            body = response.read()
            return bool(response.status == 200) and body.strip() in (b"ok", b'{"health":"true"}')
    except (OSError, ValueError, urllib.error.URLError):
        return False


# --------------------------------------------------------------------------------------------
# The control plane


@dataclass
class ApiServer:
    """One running kube-apiserver: where it listens and the admin kubeconfig that reaches it."""

    name: str
    url: str
    etcd_prefix: str
    kubeconfig: Path
    ca_file: Path
    process: ManagedProcess

    def ready(self, token: str) -> bool:
        """Whether /readyz answers ok."""
        return _http_ok(f"{self.url}/readyz", token=token, ca_file=self.ca_file)


class ControlPlane:
    """etcd plus one or more kube-apiservers (distinct etcd prefixes), all under `workdir`.

    Layout: `etcd/` (data), `etcd.log`, `etcd.pid`, `credentials/` (service-account key pair,
    static token file), `kubeconfig` (the main apiserver's admin kubeconfig), `apiservers/<name>/`
    (certs, log, pid file, and for extra apiservers their kubeconfig), `control-plane.json`.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        detach: bool = False,
        kube_apiserver: Path | None = None,
        etcd: Path | None = None,
        start_timeout: float = 90.0,
        etcd_in_memory: bool = False,
    ) -> None:
        self.workdir = workdir.resolve()
        #: etcd's data on tmpfs (/dev/shm) where there is one: a throwaway plane (tests,
        #: benchmarks) then pays no disk fsync per write, which on a shared VM disk is what
        #: bounds the apiserver's write rate. Removed when the plane stops.
        self.etcd_in_memory = etcd_in_memory and os.access("/dev/shm", os.W_OK)
        self._etcd_data: Path | None = None
        self.detach = detach
        self.kube_apiserver = kube_apiserver
        self.etcd_bin = etcd
        self.start_timeout = start_timeout
        self.etcd: ManagedProcess | None = None
        self.etcd_url = ""
        self.apiservers: dict[str, ApiServer] = {}
        #: kube-controller-managers running the garbage collector (start_garbage_collector).
        self.controller_managers: list[ManagedProcess] = []

    # -- paths ---------------------------------------------------------------------------------

    @property
    def _credentials(self) -> Path:
        return self.workdir / "credentials"

    def _apiserver_dir(self, name: str) -> Path:
        return self.workdir / "apiservers" / name

    def _kubeconfig_path(self, name: str) -> Path:
        return (
            self.workdir / "kubeconfig"
            if name == MAIN
            else self._apiserver_dir(name) / "kubeconfig"
        )

    @property
    def token(self) -> str:
        """The admin bearer token (group system:masters) that every apiserver here accepts."""
        try:
            line = (self._credentials / "tokens.csv").read_text().split("\n", 1)[0]
        except OSError:
            return ""
        return line.split(",", 1)[0]

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> ApiServer:
        """Start etcd and the main apiserver on free loopback ports; return the main apiserver."""
        if self.kube_apiserver is None or self.etcd_bin is None:
            raise ControlPlaneError("start", "ControlPlane needs the kube-apiserver and etcd paths")
        self.workdir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.workdir).free
        if free < _MIN_FREE_BYTES:
            raise ControlPlaneError(
                "disk", f"{free // 2**20} MB free under {self.workdir}; etcd needs 300 MB"
            )
        self._write_credentials()
        self._start_etcd()
        return self.add_apiserver(MAIN)

    def _write_credentials(self) -> None:
        creds = self._credentials
        shutil.rmtree(creds, ignore_errors=True)
        creds.mkdir(mode=0o700, parents=True)
        openssl = shutil.which("openssl")
        if openssl is None:
            raise ControlPlaneError("keys", "openssl not found; install the openssl package")
        for argv in (
            [openssl, "genrsa", "-out", str(creds / "sa.key"), "2048"],
            [
                openssl,
                "rsa",
                "-in",
                str(creds / "sa.key"),
                "-pubout",
                "-out",
                str(creds / "sa.pub"),
            ],
        ):
            result = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, check=False
            )
            if result.returncode != 0:
                raise ControlPlaneError(
                    "keys", f"openssl {argv[1]} failed: {result.stderr[-200:]!r}"
                )
        tokens = creds / "tokens.csv"
        tokens.touch(mode=0o600)
        tokens.write_text(
            f'{secrets.token_urlsafe(32)},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
        )

    def _etcd_data_dir(self) -> Path:
        if self._etcd_data is None:
            self._etcd_data = (
                Path(tempfile.mkdtemp(prefix="fleet-etcd-", dir="/dev/shm"))
                if self.etcd_in_memory
                else self.workdir / "etcd"
            )
        return self._etcd_data

    def _start_etcd(self) -> None:
        assert self.etcd_bin is not None
        data = self._etcd_data_dir()
        log = self.workdir / "etcd.log"
        for _ in range(_PORT_ATTEMPTS):
            shutil.rmtree(data, ignore_errors=True)
            client, peer = _free_port(), _free_port()
            url = f"http://127.0.0.1:{client}"
            peer_url = f"http://127.0.0.1:{peer}"
            argv = [
                str(self.etcd_bin),
                "--name=fleet-dev",
                f"--data-dir={data}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=fleet-dev={peer_url}",
                # A single member elects itself after one election timeout (default 1 s).
                "--heartbeat-interval=20",
                "--election-timeout=200",
                "--logger=zap",
                "--log-outputs=stderr",
            ]
            proc = _spawn("etcd", argv, log, str(self.workdir), detach=self.detach)
            try:
                _wait_ready(proc, functools.partial(_http_ok, f"{url}/health"), self.start_timeout)
            except _PortInUseError:
                proc.stop()
                continue
            except BaseException:
                proc.stop()
                raise
            self.etcd, self.etcd_url = proc, url
            (self.workdir / "etcd.pid").write_text(f"{proc.pid}\n")
            self._save()
            return
        raise ControlPlaneError(
            "port", f"etcd found no free loopback port in {_PORT_ATTEMPTS} tries"
        )

    def add_apiserver(self, name: str) -> ApiServer:
        """Start another kube-apiserver on this plane's etcd (prefix /clusters/<name>).

        The main apiserver (`MAIN`) uses the default prefix. Each has its own port, serving
        certificate and kubeconfig; all accept the same admin token.
        """
        if not _NAME.match(name):
            raise ControlPlaneError(
                "start", f"apiserver name {name!r} must be a DNS label of at most 32 characters"
            )
        if name in self.apiservers:
            raise ControlPlaneError("start", f"an apiserver named {name!r} already runs")
        if self.etcd is None or self.kube_apiserver is None:
            raise ControlPlaneError("start", "start the control plane before adding apiservers")
        directory = self._apiserver_dir(name)
        prefix = "/registry" if name == MAIN else f"/clusters/{name}"
        creds = self._credentials
        for _ in range(_PORT_ATTEMPTS):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            port = _free_port()
            url = f"https://127.0.0.1:{port}"
            argv = [
                str(self.kube_apiserver),
                f"--etcd-servers={self.etcd_url}",
                f"--etcd-prefix={prefix}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # No controller publishes a loopback endpoint for the `kubernetes` service.
                "--endpoint-reconciler-type=none",
                f"--secure-port={port}",
                "--insecure-port=0",
                f"--cert-dir={directory / 'certs'}",
                f"--token-auth-file={creds / 'tokens.csv'}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={creds / 'sa.pub'}",
                f"--service-account-signing-key-file={creds / 'sa.key'}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # No token controller creates `default` service accounts: pods must not need one.
                "--disable-admission-plugins=ServiceAccount",
                "--profiling=false",
            ]
            proc = _spawn(
                f"kube-apiserver {name}",
                argv,
                directory / "kube-apiserver.log",
                str(self.workdir),
                detach=self.detach,
            )
            server = ApiServer(
                name, url, prefix, self._kubeconfig_path(name), directory / "ca.crt", proc
            )
            token = self.token
            try:
                _wait_ready(
                    proc, functools.partial(_apiserver_ready, server, token), self.start_timeout
                )
            except _PortInUseError:
                proc.stop()
                continue
            except BaseException:
                proc.stop()
                raise
            _write_kubeconfig(server, token)
            (directory / "kube-apiserver.pid").write_text(f"{proc.pid}\n")
            self.apiservers[name] = server
            self._save()
            return server
        raise ControlPlaneError(
            "port", f"kube-apiserver {name} found no free loopback port in {_PORT_ATTEMPTS} tries"
        )

    def start_garbage_collector(self, name: str, binary: Path) -> ManagedProcess:
        """Run a kube-controller-manager with only the garbage collector against apiserver
        `name`; returns once the collector has synced its monitors (of the kinds served
        then: install CRDs first, or wait for its 30 s re-discovery).

        Give it an apiserver of its own (`add_apiserver`): it collects every namespace there.
        """
        server = self.apiservers.get(name)
        if server is None:
            raise ControlPlaneError("start", f"no apiserver named {name!r} runs")
        directory = self._apiserver_dir(name)
        log = directory / "kube-controller-manager.log"
        log.unlink(missing_ok=True)
        argv = [
            str(binary),
            f"--kubeconfig={server.kubeconfig}",
            "--controllers=garbagecollector",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            # No serving: nothing here scrapes it, and serving would need delegated authn/z.
            "--secure-port=0",
            "--port=0",
            "--concurrent-gc-syncs=5",
        ]
        proc = _spawn(
            f"kube-controller-manager {name}", argv, log, str(self.workdir), detach=self.detach
        )

        def synced() -> bool:
            try:
                return "all resource monitors have synced" in log.read_text(errors="replace")
            except OSError:
                return False

        try:
            _wait_ready(proc, synced, self.start_timeout)
        except BaseException:
            proc.stop()
            raise
        self.controller_managers.append(proc)
        return proc

    # -- state ---------------------------------------------------------------------------------

    def _save(self) -> None:
        state = {
            "etcdUrl": self.etcd_url,
            "apiservers": {
                s.name: {"url": s.url, "etcdPrefix": s.etcd_prefix}
                for s in self.apiservers.values()
            },
        }
        (self.workdir / _STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, workdir: Path) -> ControlPlane | None:
        """The plane recorded under workdir (pid files and state), or None if none is recorded.

        Processes of a loaded plane may have died: check `healthy()`.
        """
        plane = cls(workdir)
        try:
            state = json.loads((plane.workdir / _STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        marker = str(plane.workdir)
        etcd_pid = _read_pid(plane.workdir / "etcd.pid")
        if etcd_pid is not None:
            plane.etcd = ManagedProcess(
                "etcd", etcd_pid, "etcd", marker, plane.workdir / "etcd.log"
            )
        plane.etcd_url = str(state.get("etcdUrl", ""))
        for name, info in dict(state.get("apiservers", {})).items():
            directory = plane._apiserver_dir(name)
            pid = _read_pid(directory / "kube-apiserver.pid")
            if pid is None:
                continue
            proc = ManagedProcess(
                f"kube-apiserver {name}",
                pid,
                "kube-apiserver",
                marker,
                directory / "kube-apiserver.log",
            )
            plane.apiservers[name] = ApiServer(
                name,
                str(info["url"]),
                str(info["etcdPrefix"]),
                plane._kubeconfig_path(name),
                directory / "ca.crt",
                proc,
            )
        return plane

    def processes(self) -> list[ManagedProcess]:
        """Every process of the plane, apiservers first (the order to stop them in)."""
        procs = [*self.controller_managers, *(s.process for s in self.apiservers.values())]
        return procs + ([self.etcd] if self.etcd is not None else [])

    def healthy(self) -> bool:
        """Whether etcd and every apiserver run and the apiservers answer /readyz."""
        if self.etcd is None or MAIN not in self.apiservers:
            return False
        if not all(p.alive() for p in self.processes()):
            return False
        token = self.token
        return all(s.ready(token) for s in self.apiservers.values())

    def stop(self, *, purge: bool = False) -> list[str]:
        """Stop every process of the plane (only those it started); return what was stopped.

        Removes pid files, state and kubeconfigs; `purge` also removes etcd's data.
        """
        stopped = []
        for server in self.apiservers.values():  # in parallel: each takes about a second
            if server.process.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server.process.pid, signal.SIGTERM)
        for proc in self.processes():
            if proc.alive():
                proc.stop()
                stopped.append(f"{proc.name} (pid {proc.pid})")
        for server in self.apiservers.values():
            for path in (server.kubeconfig, server.process.log.parent / "kube-apiserver.pid"):
                path.unlink(missing_ok=True)
        for path in (self.workdir / "etcd.pid", self.workdir / _STATE_FILE):
            path.unlink(missing_ok=True)
        if purge:
            shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        if self.etcd_in_memory and self._etcd_data is not None:
            shutil.rmtree(self._etcd_data, ignore_errors=True)
            self._etcd_data = None
        self.apiservers.clear()
        self.controller_managers.clear()
        self.etcd = None
        return stopped


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _extract_ca(server: ApiServer) -> bool:
    """Write the CA of the apiserver's self-signed certificate (the last PEM block) to ca_file."""
    if server.ca_file.exists():
        return True
    try:
        bundle = (server.process.log.parent / "certs" / "apiserver.crt").read_text()
    except OSError:
        return False
    blocks = re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", bundle, re.S)
    if not blocks:
        return False
    server.ca_file.write_text(blocks[-1] + "\n")
    return True


def _apiserver_ready(server: ApiServer, token: str) -> bool:
    return _extract_ca(server) and server.ready(token)


def _write_kubeconfig(server: ApiServer, token: str) -> None:
    """Write an admin kubeconfig (JSON, which is YAML) trusting the apiserver's own CA."""
    context = f"fleet-dev-{server.name}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {"server": server.url, "certificate-authority": str(server.ca_file)},
            }
        ],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": ADMIN_USER}}],
        "current-context": context,
        "preferences": {},
    }
    server.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    server.kubeconfig.touch(mode=0o600)
    server.kubeconfig.write_text(json.dumps(config, indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# Command line (scripts/dev-control-plane)


@contextlib.contextmanager
def _locked(workdir: Path) -> Iterator[None]:
    """Serialise up/down/status on one directory."""
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _up(workdir: Path) -> int:
    plane = ControlPlane.load(workdir)
    if plane is not None:
        if plane.healthy():
            pids = ", ".join(f"{p.name} pid {p.pid}" for p in plane.processes())
            print(f"dev-control-plane: reusing the running control plane ({pids})", file=sys.stderr)
            print(plane.apiservers[MAIN].kubeconfig)
            return 0
        stopped = plane.stop()
        note = f"stopped its remains: {', '.join(stopped)}" if stopped else "nothing of it runs"
        print(
            f"dev-control-plane: the recorded control plane is not healthy; {note}", file=sys.stderr
        )
    apiserver, etcd = ensure_binaries()
    plane = ControlPlane(workdir, detach=True, kube_apiserver=apiserver, etcd=etcd)
    began = time.monotonic()
    try:
        server = plane.start()
    except BaseException:
        plane.stop()
        raise
    print(
        f"dev-control-plane: etcd {plane.etcd_url} and kube-apiserver {server.url} "
        f"ready in {time.monotonic() - began:.1f} s",
        file=sys.stderr,
    )
    print(server.kubeconfig)
    return 0


def _down(workdir: Path) -> int:
    plane = ControlPlane.load(workdir)
    stopped = plane.stop() if plane is not None else []
    print(
        f"dev-control-plane: stopped {', '.join(stopped)}"
        if stopped
        else "dev-control-plane: nothing running"
    )
    return 0


def _status(workdir: Path) -> int:
    plane = ControlPlane.load(workdir)
    if plane is None:
        print("not running")
        return 3
    token = plane.token
    if plane.etcd is not None:
        state = "running" if plane.etcd.alive() else "not running"
        print(f"etcd: {state} (pid {plane.etcd.pid}, {plane.etcd_url})")
    for server in plane.apiservers.values():
        if not server.process.alive():
            state = "not running"
        else:
            state = "ready" if server.ready(token) else "running, not ready"
        print(f"kube-apiserver {server.name}: {state} (pid {server.process.pid}, {server.url})")
    healthy = plane.healthy()
    print(
        f"kubeconfig: {plane.apiservers[MAIN].kubeconfig}"
        if healthy
        else "control plane: unhealthy"
    )
    return 0 if healthy else 1


def main(argv: list[str] | None = None) -> int:
    """`up | down | status` of the developer control plane in FLEET_DEV_DIR (default .dev/)."""
    parser = argparse.ArgumentParser(
        prog="dev-control-plane", description="Local etcd + kube-apiserver on loopback ports."
    )
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("FLEET_DEV_DIR") or DEFAULT_DEV_DIR),
        help="state directory (default: $FLEET_DEV_DIR or .dev/ in the repository)",
    )
    args = parser.parse_args(argv)
    command = {"up": _up, "down": _down, "status": _status}[args.command]
    try:
        with _locked(args.dir):
            return command(args.dir.resolve())
    except ControlPlaneError as error:
        print(f"dev-control-plane: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dev-control-plane: step interrupted: stopped by the user", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
