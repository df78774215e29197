"""`python -m tests.support.aks_emulator`: a demo AKS (ARM) emulator on loopback until Ctrl-C.

It serves N managed clusters c1..cN in subscription 00000000-0000-0000-0000-0000000000a1,
resource group demo-rg, at 1.29.7 (pools system and user), the region offering 1.30.3, and
plays Entra ID's token endpoint. It writes into --dir a plugin configuration, the federated
token and the emulator's CA, and prints the environment that makes fleet-plugin-aks use
workload identity against it:

    env $(cat DIR/env) fleet-plugin-aks --listen 127.0.0.1:9090 --config DIR/config.yaml
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import threading
from pathlib import Path

import yaml

from tests.support.aks_emulator import AksEmulator

SUBSCRIPTION, GROUP, LOCATION = "00000000-0000-0000-0000-0000000000a1", "demo-rg", "westeurope"
OLD, NEW = "1.29.7", "1.30.3"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.aks_emulator")
    parser.add_argument("--clusters", type=int, default=4, help="number of clusters")
    parser.add_argument("--seconds", type=float, default=5.0, help="each operation's run time")
    parser.add_argument("--dir", default="", help="where to write config.yaml, env, ca.crt")
    args = parser.parse_args()
    out = Path(args.dir or tempfile.mkdtemp(prefix="aks-emulator-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    with AksEmulator(op_seconds=args.seconds) as emulator:
        emulator.set_versions(LOCATION, [OLD, NEW])
        for index in range(1, args.clusters + 1):
            emulator.add_cluster(
                f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/"
                f"Microsoft.ContainerService/managedClusters/c{index}",
                location=LOCATION,
                version=OLD,
                pools=[{"name": "system", "mode": "System"}, {"name": "user"}],
                tags={"fleet": "demo"},
            )
        shutil.copy(emulator.ca_file, out / "ca.crt")
        (out / "federated-token").write_text(emulator.federated_token)
        config = {
            "clusters": {"discover": [{"subscription": SUBSCRIPTION, "resourceGroup": GROUP}]},
            "api": {
                "endpoint": emulator.endpoint,
                "caFile": str(out / "ca.crt"),
                "disableInstanceDiscovery": True,
            },
            "operations": {"pollSeconds": 1, "stateFile": str(out / "operations.jsonl")},
            "traffic": {"mode": "recordOnly"},
        }
        (out / "config.yaml").write_text(yaml.safe_dump(config))
        env = {
            "AZURE_CLIENT_ID": emulator.client_id,
            "AZURE_TENANT_ID": emulator.tenant_id,
            "AZURE_FEDERATED_TOKEN_FILE": str(out / "federated-token"),
            "AZURE_AUTHORITY_HOST": emulator.endpoint,
            "REQUESTS_CA_BUNDLE": str(out / "ca.crt"),
        }
        (out / "env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        print(f"AKS emulator at {emulator.endpoint} ({args.clusters} clusters); Ctrl-C stops it")
        print(f"env $(cat {out}/env) fleet-plugin-aks --config {out}/config.yaml")
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
