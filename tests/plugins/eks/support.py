"""Helpers of the EKS plugin tests: an emulated EKS fleet, plugin configs pointing at it, waits."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.eks import EksPlugin, EksPluginOptions, parse_config
from plugins.sdk.client import PluginClient
from tests.support.eks_emulator import ACCOUNT, EksEmulator
from tests.support.eks_emulator.route53 import Route53Emulator

T = TypeVar("T")

REGION = "us-west-2"
OTHER_REGION = "eu-west-1"
OLD, NEW, NEXT = "1.29", "1.30", "1.31"
POOLS = ("system", "workers")
TERMINAL = (cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED)


def cluster_id(name: str, region: str = REGION) -> str:
    """The ARN of an emulated cluster."""
    return f"arn:aws:eks:{region}:{ACCOUNT}:cluster/{name}"


def populate(emulator: EksEmulator, names: list[str], region: str = REGION) -> list[str]:
    """Clusters at OLD with node groups POOLS (tags fleet=demo, ring=canary for the first),
    EKS offering 1.28 (unsupported), OLD, NEW and NEXT."""
    emulator.set_versions(
        {
            "1.28": "unsupported",
            OLD: "extended-support",
            NEW: "standard-support",
            NEXT: "standard-support",
        }
    )
    return [
        emulator.add_cluster(
            region,
            name,
            OLD,
            list(POOLS),
            {"fleet": "demo", "ring": "canary" if index == 0 else "main"},
        )
        for index, name in enumerate(names)
    ]


ZONE, RECORD = "Z0FLEET", "app.example.com"


def route53_traffic(
    route53: Route53Emulator, names: list[str], weight: int = 100, ttl: int = 60, **extra: Any
) -> dict[str, Any]:
    """Weighted records app.example.com (one per cluster, set identifier = the name) in the
    emulator, and the traffic configuration naming them (drainSeconds 0 unless given)."""
    for index, name in enumerate(names):
        route53.add_weighted(ZONE, RECORD, name, weight, f"192.0.2.{index + 1}", ttl)
    records = {
        cluster_id(name): [
            {"hostedZoneId": ZONE, "name": RECORD, "setIdentifier": name, "weight": weight}
        ]
        for name in names
    }
    return {
        "mode": "route53",
        "route53": {"endpoint": route53.endpoint, "records": records, "drainSeconds": 0, **extra},
    }


def plugin_config(
    emulator: EksEmulator,
    *,
    regions: tuple[str, ...] = (REGION,),
    state_file: Path | None = None,
    max_attempts: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """A plugin configuration (as data) for the emulated fleet."""
    data: dict[str, Any] = {
        "account": ACCOUNT,
        "regions": list(regions),
        "api": {"endpoint": emulator.endpoint, "maxAttempts": max_attempts},
        "operations": {"pollSeconds": 0.05},
    }
    if state_file is not None:
        data["operations"]["stateFile"] = str(state_file)
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value}
    return data


@dataclass
class RunningPlugin:
    """An EKS plugin on loopback and a client of it."""

    plugin: EksPlugin
    client: PluginClient

    @property
    def address(self) -> str:
        return self.plugin.address

    def stop(self) -> None:
        self.client.close()
        self.plugin.stop(grace=0)


@contextmanager
def running_plugin(config: dict[str, Any]) -> Iterator[RunningPlugin]:
    """A started plugin with the configuration data; stopped on exit."""
    plugin = EksPlugin(EksPluginOptions(config=parse_config(config), registry=CollectorRegistry()))
    running = RunningPlugin(plugin, PluginClient(plugin.address, caller="eks-tests"))
    try:
        yield running
    finally:
        running.stop()


def wait_until(predicate: Callable[[], T | None], timeout: float = 15.0, what: str = "") -> T:
    """Polls predicate until it returns a truthy value; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)


def wait_terminal(client: PluginClient, op_id: str, timeout: float = 15.0) -> cluster_pb2.Operation:
    """Polls GetOperation until the operation is SUCCEEDED or FAILED."""
    return wait_until(
        lambda: op if (op := client.get_operation(op_id)).state in TERMINAL else None,
        timeout,
        f"operation {op_id} terminal",
    )
