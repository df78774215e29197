"""Provider plugins of the fleet upgrade orchestrator, each a gRPC server, and their shared SDK."""
