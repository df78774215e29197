"""The conformance suite's test modules (run them with plugins.sdk.conformance.run_conformance)."""
