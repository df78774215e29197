"""`python -m tests.support.gke_emulator`: a demo GKE API emulator on loopback until Ctrl-C.

It serves N clusters projects/p/locations/l/clusters/c1..cN at 1.28.5-gke.1200 (pools
default-pool and workers), GetServerConfig offering 1.29.1-gke.1589020, and a global backend
service "web" with one NEG per cluster; point fleet-plugin-gke at the printed endpoint with
api.credentials: anonymous.
"""

from __future__ import annotations

import argparse
import threading

from tests.support.gke_emulator import GkeEmulator, OpTiming

OLD, NEW = "1.28.5-gke.1200", "1.29.1-gke.1589020"
NEG = "https://www.googleapis.com/compute/v1/projects/p/zones/l-a/networkEndpointGroups/neg-{}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.gke_emulator")
    parser.add_argument("--port", type=int, default=0, help="loopback port (default: any)")
    parser.add_argument("--clusters", type=int, default=4, help="number of clusters")
    parser.add_argument("--seconds", type=float, default=5.0, help="each upgrade's run time")
    args = parser.parse_args()
    timing = OpTiming(1.0, args.seconds)
    emulator = GkeEmulator(master_seconds=timing, nodes_seconds=timing, port=args.port)
    emulator.set_server_config("p", "l", master_versions=[OLD, NEW])
    names = [f"c{i}" for i in range(1, args.clusters + 1)]
    for name in names:
        emulator.add_cluster(
            f"projects/p/locations/l/clusters/{name}",
            master_version=OLD,
            node_pools=[{"name": "default-pool"}, {"name": "workers"}],
            labels={"fleet": "demo"},
        )
    emulator.add_backend_service("p", "web", [{"group": NEG.format(n)} for n in names])
    emulator.start()
    print(f"GKE API emulator at {emulator.endpoint} ({len(names)} clusters); Ctrl-C stops it")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        emulator.stop()


if __name__ == "__main__":
    main()
