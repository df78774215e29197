"""Conformance kit: a pytest suite that checks any plugin endpoint against the contract v1."""

from plugins.sdk.conformance.runner import SUITE_DIR, run_conformance
from plugins.sdk.conformance.target import ConformanceTarget

__all__ = ["SUITE_DIR", "ConformanceTarget", "run_conformance"]
