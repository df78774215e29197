"""Developer tooling shared by scripts/ and tests/ (the local control plane); not shipped."""
