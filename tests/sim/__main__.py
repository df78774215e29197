"""Replay or sweep simulated histories: `python -m tests.sim --seed 1234` (one, with its
history), `python -m tests.sim --seeds 5000 --start 0` (a sweep; failures print their replay)."""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time

from tests.sim.invariants import Violation
from tests.sim.world import Config, simulate


def describe(seed: int) -> str:
    cfg = Config.draw(seed)
    return (
        f"seed {seed}: {cfg.clusters} clusters, {cfg.owners} owner(s), profile {cfg.profile}, "
        f"replicas {cfg.replicas}, preflight {cfg.preflight}, shared driver {cfg.shared_driver}"
        + (f", {cfg.providers} providers" if cfg.providers > 1 else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--seed", type=int, help="replay one seed and print its history")
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds to sweep")
    parser.add_argument("--start", type=int, default=0, help="first seed of the sweep")
    parser.add_argument("--history", type=int, default=60, help="history lines to print")
    parser.add_argument("--workers", type=int, default=1, help="processes for a sweep")
    args = parser.parse_args(argv)
    if args.seed is not None:
        print(describe(args.seed))
        try:
            world = simulate(args.seed)
        except Violation as err:
            lines = err.world.history if err.world else []
            print("\n".join(lines[-args.history :]))
            print(f"VIOLATION {err}")
            return 1
        print("\n".join(world.history[-args.history :]))
        print(f"ok: {len(world.history)} events, t={world.now}")
        return 0
    began = time.monotonic()
    seeds = range(args.start, args.start + args.seeds)
    failed = []
    with multiprocessing.get_context("fork").Pool(max(1, args.workers)) as pool:
        for result in pool.imap_unordered(_one, seeds, chunksize=4):
            if result is not None:
                seed, message = result
                failed.append(result)
                print(f"seed {seed}: {message}\n  replay: python -m tests.sim --seed {seed}")
                sys.stdout.flush()
    took = time.monotonic() - began
    print(f"{args.seeds - len(failed)}/{args.seeds} seeds held every invariant in {took:.1f}s")
    return 1 if failed else 0


def _one(seed: int) -> tuple[int, str] | None:
    try:
        simulate(seed)
    except Violation as err:
        return seed, str(err)
    return None


if __name__ == "__main__":
    sys.exit(main())
