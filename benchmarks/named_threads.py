"""Run a module as __main__ with every Python thread's name given to its OS thread, and each
(thread id, name) appended to a file, so that the benchmark can read each thread's CPU from the
OS (/proc/PID/task/TID/stat) and say which thread spent it. CPython 3.11 does not name OS
threads itself; without this every thread of the orchestrator is "python".

    python -m benchmarks.named_threads TIDFILE MODULE [ARGS...]

Only the benchmark uses it; the orchestrator's code runs unchanged (runpy). A profile hook
names a thread on its first Python event and removes itself, so it costs nothing afterwards.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import runpy
import sys
import threading
from typing import Any

__all__ = ["main"]

_PR_SET_NAME = 15  # prctl(2): the calling thread's name, 15 bytes and a NUL
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_lock = threading.Lock()
_sink: Any = None


def _name_this_thread() -> None:
    name = threading.current_thread().name
    _libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    with _lock:
        _sink.write(f"{threading.get_native_id()}\t{name}\n")
        _sink.flush()


def _first_event(frame: Any, event: str, arg: Any) -> None:
    sys.setprofile(None)
    _name_this_thread()


def main() -> None:
    """Name threads, then run the module with the remaining arguments."""
    global _sink  # noqa: PLW0603 - one file for the process's life
    if len(sys.argv) < 3:
        raise SystemExit("usage: python -m benchmarks.named_threads TIDFILE MODULE [ARGS...]")
    _sink = open(sys.argv[1], "a", encoding="utf-8")  # noqa: SIM115 - open until exit
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    threading.setprofile(_first_event)
    _name_this_thread()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
