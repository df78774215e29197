"""The reconcilers: the manager, one controller per kind, approval gates."""
