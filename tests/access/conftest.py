"""Fixtures of the access tests: the install's namespace (shared with the manifest tests)."""

from tests.install.conftest import install_namespace

__all__ = ["install_namespace"]
