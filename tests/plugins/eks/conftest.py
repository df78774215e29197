"""Fixtures of the EKS plugin tests: AWS credentials for boto3's default chain (fake, from the
environment, as a pod's would come), an EKS emulator with four clusters, a plugin factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from tests.plugins.eks.support import plugin_config, populate, running_plugin
from tests.support.eks_emulator import EksEmulator
from tests.support.eks_emulator.route53 import Route53Emulator
from tests.support.plugin_harness import RunningPlugin

NAMES = ["c1", "c2", "c3", "c4"]
SECRET = "fake-secret-key-never-logged"

StartPlugin = Callable[..., RunningPlugin]


@pytest.fixture(autouse=True)
def aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials through the environment (the first link of boto3's chain); no profile or
    config file of the machine is read."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFLEETUPGRADETEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def emulator() -> Iterator[EksEmulator]:
    """The emulator with c1..c4 at 1.29 (node groups system and workers)."""
    with EksEmulator(update_seconds=0.3) as emu:
        populate(emu, NAMES)
        yield emu


@pytest.fixture
def route53() -> Iterator[Route53Emulator]:
    """A Route 53 emulator (changes INSYNC after 0.2 s); route53_traffic() fills it."""
    with Route53Emulator(sync_seconds=0.2) as emu:
        yield emu


@pytest.fixture
def start_plugin(emulator: EksEmulator) -> Iterator[StartPlugin]:
    """start_plugin(config=None, **plugin_config_options) -> RunningPlugin, stopped after."""
    with ExitStack() as stack:

        def start(config: dict[str, Any] | None = None, **options: Any) -> RunningPlugin:
            data = config if config is not None else plugin_config(emulator, **options)
            return stack.enter_context(running_plugin(data))

        yield start
