"""Fixtures of the contract tests: a generated test PKI shared by the session."""

from __future__ import annotations

import pytest

from tests.support.certs import TestPKI, generate_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    """A CA, server cert (127.0.0.1, localhost), client cert and a stranger's client cert."""
    return generate_pki(tmp_path_factory.mktemp("pki"))
