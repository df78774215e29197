"""`make bench`: the plugin benchmark, then the orchestrator benchmark, one after the other.

python -m benchmarks.run_all [--json PATH]   (PATH receives the orchestrator's numbers)
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import bench_orchestrator, bench_plugin

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Runs every benchmark; non-zero when one of them fails."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run_all")
    parser.add_argument("--json", metavar="PATH", help="write the orchestrator's numbers here")
    args = parser.parse_args(argv)
    status = 0
    print("== plugin (benchmarks/bench_plugin.py)", flush=True)
    status |= bench_plugin.main([])
    print("\n== orchestrator (benchmarks/bench_orchestrator.py)", flush=True)
    status |= bench_orchestrator.main(["--json", args.json] if args.json else [])
    return status


if __name__ == "__main__":
    sys.exit(main())
