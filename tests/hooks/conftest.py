"""The real stack for this folder's end-to-end tests (`*_e2e.py`): apiserver, the real
`fleet-orchestrator run`, the sim plugin over gRPC. Its fixtures are defined once, in
tests/e2e/conftest.py; this makes them visible here."""

from tests.e2e.conftest import objects, orchestrators, sim

__all__ = ["objects", "orchestrators", "sim"]
