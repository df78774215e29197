"""Where an unclosed TLS socket was opened, when its ResourceWarning fails a test.

The suite turns warnings into errors, so a TLS socket some object dropped without closing fails
whichever test is running when the garbage collector finds it, often long after and far from
where it was opened; the warning names only its local address. This pytest plugin remembers
the stack that opened each TLS client socket, and the test running then, by local port, and
adds them to the report of a test that failed on such a warning, so the leak can be found from
one CI log. Every port is kept (an unclosed socket keeps its port, so no later socket can take
its entry; the ephemeral range bounds the table), each stack compact. It changes no outcome.
"""

from __future__ import annotations

import re
import ssl
import threading
import traceback
from collections import OrderedDict
from collections.abc import Generator
from typing import Any

import pytest

__all__ = ["opened_at", "pytest_runtest_makereport", "pytest_runtest_protocol"]

_KEEP = 65536
#: The test running now (its node id), recorded with each socket opened.
_running = ["(no test)"]
_PORT = re.compile(r"unclosed <ssl\.SSLSocket[^>]*laddr=\('[^']*', (\d+)\)")
_origins: OrderedDict[int, str] = OrderedDict()
_lock = threading.Lock()
_wrap = ssl.SSLContext.wrap_socket


def _recording_wrap(self: ssl.SSLContext, sock: Any, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
    wrapped = _wrap(self, sock, *args, **kwargs)
    try:
        port = int(wrapped.getsockname()[1])
    except (OSError, IndexError, TypeError, ValueError):
        return wrapped
    frames = traceback.extract_stack(limit=40)[:-1]
    stack = "\n".join(f"  {f.filename}:{f.lineno} {f.name}" for f in frames)
    thread = threading.current_thread().name
    with _lock:
        _origins[port] = f"during {_running[0]}, thread {thread}:\n{stack}"
        _origins.move_to_end(port)
        while len(_origins) > _KEEP:
            _origins.popitem(last=False)
    return wrapped


ssl.SSLContext.wrap_socket = _recording_wrap  # type: ignore[method-assign]


def opened_at(text: str) -> list[tuple[int, str]]:
    """(local port, where it was opened) for each unclosed TLS socket the text mentions."""
    with _lock:
        return [
            (port, _origins.get(port, "not recorded (opened before the plugin, or long ago)"))
            for port in sorted({int(p) for p in _PORT.findall(text)})
        ]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    _running[0] = item.nodeid
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for port, origin in opened_at(str(report.longrepr)):
        report.sections.append((f"unclosed TLS socket (local port {port}) opened at", origin))
