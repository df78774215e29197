"""The fleet upgrade orchestrator, one package per layer: cli > operate | controllers > adapters >
pipeline > engine > api (docs/architecture.md "Packages: the layers")."""
