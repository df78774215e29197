"""The caller's CPU per plugin unary call: blocking calls from a pool of threads (how a pass's
preflights and mutations were made) against the same calls started as futures from one thread
(`PluginClient.start_*`, as the run driver now makes a pass's calls), over loopback against
fleet-plugin-sim.

Prints, per way and RPC, this process's CPU (all its threads, gRPC core's included, from the
OS) per call and the wall per batch; it is not a test.

    python -m benchmarks.bench_plugin_calls [--calls 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import resource
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import grpc.experimental

from benchmarks.bench_plugin import _sim
from fleetupgrade.plugin.v1 import cluster_pb2, cluster_pb2_grpc
from plugins.sdk.client import PendingCall, PluginCallError, PluginClient

__all__ = ["main"]

#: Calls in flight at once when started (RunDriver._pipelined: the driver's parallelism).
WINDOW = 32


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _blocking(threads: int) -> Callable[[Sequence[Callable[[], object]]], None]:
    """Every call made blocking by `threads` workers sharing the list (RunDriver._each)."""
    pool = ThreadPoolExecutor(threads)

    def run(calls: Sequence[Callable[[], object]]) -> None:
        lock = threading.Lock()
        position = 0

        def work() -> None:
            nonlocal position
            while True:
                with lock:
                    if position >= len(calls):
                        return
                    call = calls[position]
                    position += 1
                call()

        for f in [pool.submit(work) for _ in range(threads)]:
            f.result()

    return run


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; prints one line per way, RPC and round."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_plugin_calls")
    parser.add_argument("--calls", type=int, default=1000, help="calls per batch")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    n = args.calls
    ways = [
        ("blocking, 32 threads", 32),
        ("blocking, 8 threads", 8),
        ("started, 1 thread", 0),
    ]
    clusters = n * ((len(ways) + 2) * args.rounds + 1)
    with _sim(clusters) as (address, _pid):
        client = PluginClient(address)
        ids = [c.id for c in client.list_clusters(page_size=5000)]
        for cid in ids[:200]:  # warm up
            client.preflight_upgrade(cid, "1.99.0")
        fresh = iter(ids[200:])
        blocking = {threads: _blocking(threads) for _, threads in ways if threads}
        for round_no in range(1, args.rounds + 1):
            for label, threads in ways:
                batch = [next(fresh) for _ in range(n)]
                for rpc in ("PreflightUpgrade", "ServiceOut"):
                    if rpc == "PreflightUpgrade":
                        items = [("", cid) for cid in batch]
                    else:
                        items = [(f"bench-{label}-{cid}", cid) for cid in batch]
                    failures = 0
                    cpu0, wall0 = _cpu(), time.perf_counter()
                    if threads:

                        def one(rid: str, cid: str, rpc: str = rpc) -> object:
                            if rpc == "PreflightUpgrade":
                                return client.preflight_upgrade(cid, "1.99.0")
                            return client.service_out(rid, cid)

                        blocking[threads]([lambda r=r, c=c: one(r, c) for r, c in items])
                    else:  # as RunDriver._pipelined: at most 32 in flight, answers in order
                        window: deque[PendingCall[object]] = deque()
                        for rid, cid in items:
                            if len(window) >= WINDOW:
                                failures += _failed(window.popleft())
                            if rpc == "PreflightUpgrade":
                                window.append(client.start_preflight_upgrade(cid, "1.99.0"))
                            else:
                                window.append(client.start_service_out(rid, cid))
                        while window:
                            failures += _failed(window.popleft())
                    cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
                    print(
                        f"round {round_no}  {label:<22} {rpc:<17} {n} calls: "
                        f"{cpu / n * 1e6:6.0f} us CPU/call  {wall * 1e3:7.0f} ms wall"
                        + (f"  ({failures} failed)" if failures else "")
                    )
        for round_no in range(1, args.rounds + 1):
            for single in (False, True):
                batch = [next(fresh) for _ in range(n)]
                print(f"round {round_no}  " + _watch_cpu(address, single, client, batch))
        client.close()
    return 0


def _watch_cpu(address: str, single_threaded: bool, client: PluginClient, ids: list[str]) -> str:
    """CPU per WatchOperations message read by one thread, the stream read on that thread
    (SingleThreadedUnaryStream, as PluginClient's channel has it) or handed over by the
    channel's polling thread (gRPC's default): ServiceOut on every id, then the process's CPU
    from the last call's answer until the watch saw every operation end."""
    options: list[tuple[str, Any]] = []
    if single_threaded:
        options.append((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1))
    channel = grpc.insecure_channel(address, options=options)
    stream = cluster_pb2_grpc.ClusterServiceStub(channel).WatchOperations(
        cluster_pb2.WatchOperationsRequest(include_in_flight=False)
    )
    wanted, ended, seen = set(ids), set(), [0]
    done = threading.Event()

    def read() -> None:
        try:
            for message in stream:
                seen[0] += 1
                op = message.operation
                if op.cluster_id in wanted and op.state == cluster_pb2.OPERATION_STATE_SUCCEEDED:
                    ended.add(op.cluster_id)
                    if ended == wanted:
                        done.set()
        except grpc.RpcError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.5)
    tag = "single" if single_threaded else "handed-over"
    for cid in ids:
        client.service_out(f"bench-watch-{tag}-{cid}", cid)
    before, cpu0 = seen[0], _cpu()
    done.wait(120)
    cpu, messages = _cpu() - cpu0, seen[0] - before
    stream.cancel()
    reader.join(5)
    channel.close()
    label = "read on its thread" if single_threaded else "handed over (default)"
    return (
        f"WatchOperations, {label:<22} {messages} messages: "
        f"{cpu / max(messages, 1) * 1e6:6.0f} us CPU/message"
    )


def _failed(pending: PendingCall[object]) -> int:
    try:
        pending.result()
    except PluginCallError:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
