"""The upstream files the tests load: pinned in the repo, fetched and checked when
../shared/upstream is absent (a plain clone), and one clear message when they cannot be had."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from devtools.controlplane import REPO_ROOT
from tests.support.upstream import (
    ENV_DIR,
    ENV_URL,
    PINS,
    UpstreamMissing,
    load_pins,
    resolve_upstream,
    upstream_dir,
)

PIN_LIST = load_pins()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    paths: list[str]


class _Handler(SimpleHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        super().do_GET()


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """(base URL, served root, requested paths): a loopback server laid out as
    raw.githubusercontent.com (<repo>/<commit>/<path>) with the same files."""
    root = tmp_path / "served"
    source = upstream_dir()
    for pin in PIN_LIST:
        target = root / pin.repo / pin.commit / pin.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / pin.name, target)
    server = _Server(("127.0.0.1", 0), partial(_Handler, directory=str(root)))
    server.paths = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root, server.paths
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_every_upstream_file_is_pinned_and_matches_its_pin() -> None:
    directory = upstream_dir()  # checks each pinned file's sha256
    present = {
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and p.name != "SOURCES.md" and not p.name.endswith(".part")
    }
    assert present == {pin.name for pin in PIN_LIST}
    assert all(len(pin.commit) == 40 and len(pin.sha256) == 64 for pin in PIN_LIST)


def test_a_plain_clone_fetches_every_file_once_checks_it_and_caches_it_outside_the_tree(
    mirror: tuple[str, Path, list[str]], tmp_path: Path
) -> None:
    url, _, requested = mirror
    cache = tmp_path / "cache"
    got = resolve_upstream(shared=tmp_path / "no-shared", base_url=url, cache=cache)
    assert got.is_relative_to(cache) and not got.is_relative_to(REPO_ROOT)
    assert sorted(requested) == sorted(f"/{p.repo}/{p.commit}/{p.path}" for p in PIN_LIST)
    for pin in PIN_LIST:
        assert (got / pin.name).read_bytes() == (upstream_dir() / pin.name).read_bytes()
    # Cached: a second run asks for nothing; a damaged file is fetched again, alone.
    assert resolve_upstream(shared=tmp_path / "no-shared", base_url=url, cache=cache) == got
    assert len(requested) == len(PIN_LIST)
    damaged = PIN_LIST[0]
    (got / damaged.name).write_text("tampered")
    resolve_upstream(shared=tmp_path / "no-shared", base_url=url, cache=cache)
    assert requested[len(PIN_LIST) :] == [f"/{damaged.repo}/{damaged.commit}/{damaged.path}"]
    assert (got / damaged.name).read_bytes() == (upstream_dir() / damaged.name).read_bytes()


def test_a_served_file_that_differs_from_its_pin_is_refused(
    mirror: tuple[str, Path, list[str]], tmp_path: Path
) -> None:
    url, root, _ = mirror
    pin = PIN_LIST[-1]
    (root / pin.repo / pin.commit / pin.path).write_text("kind: NotTheUpstreamFile\n")
    with pytest.raises(UpstreamMissing) as err:
        resolve_upstream(shared=tmp_path / "no-shared", base_url=url, cache=tmp_path / "cache")
    message = str(err.value)
    assert f"1 of {len(PIN_LIST)} could not be fetched" in message
    assert f"{pin.name}: {url}/{pin.repo}/{pin.commit}/{pin.path} does not match" in message
    assert not list((tmp_path / "cache").rglob(Path(pin.name).name))


def test_offline_the_message_says_what_is_missing_and_how_to_provide_it(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    with pytest.raises(UpstreamMissing) as err:
        resolve_upstream(
            shared=tmp_path / "no-shared",
            base_url=f"http://127.0.0.1:{port}",
            cache=tmp_path / "cache",
            timeout=5,
        )
    message = str(err.value)
    assert f"{len(PIN_LIST)} of {len(PIN_LIST)} could not be fetched" in message
    assert f"{tmp_path / 'no-shared'} does not exist" in message
    assert f"cannot reach http://127.0.0.1:{port}/" in message
    for needle in (ENV_DIR, ENV_URL, str(PINS)):
        assert needle in message, message


def test_the_test_run_stops_with_that_one_message(tmp_path: Path) -> None:
    """A run that needs the files and cannot have them ends at once (exit 3) with the one
    message: no skip, no error per test."""
    tests = tmp_path / "test_needs_upstream.py"
    tests.write_text(
        "from tests.support.upstream import upstream_file\n\n"
        + "".join(
            f"def test_{i}():\n    assert upstream_file('crds/ocm_managedclusters.yaml')\n\n"
            for i in range(3)
        )
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
        cwd=REPO_ROOT,
        env={**os.environ, ENV_DIR: str(empty)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 3, output
    assert output.count(f"{ENV_DIR}={empty} lacks {len(PIN_LIST)} of {len(PIN_LIST)}") == 1
    assert "passed" not in output and "skipped" not in output
