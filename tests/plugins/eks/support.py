"""Helpers of the EKS plugin tests: an emulated EKS fleet, plugin configs pointing at it, waits."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from plugins.eks import EksPlugin, EksPluginOptions, parse_config
from tests.support.eks_emulator import ACCOUNT, EksEmulator
from tests.support.eks_emulator.route53 import Route53Emulator
from tests.support.plugin_harness import (  # the tests import them from here too
    RunningPlugin,
    serving,
)

REGION = "us-west-2"
OTHER_REGION = "eu-west-1"
OLD, NEW, NEXT = "1.29", "1.30", "1.31"
POOLS = ("system", "workers")


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


def running_plugin(config: dict[str, Any]) -> AbstractContextManager[RunningPlugin[EksPlugin]]:
    """A started plugin with the configuration data and a client of it; stopped on exit."""
    options = EksPluginOptions(config=parse_config(config), registry=CollectorRegistry())
    return serving(EksPlugin(options), "eks-tests")
