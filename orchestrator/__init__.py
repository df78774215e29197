"""The fleet upgrade orchestrator: ClusterVersion API, pure planner, reconciler and CLI."""
