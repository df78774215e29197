"""The I/O: Kubernetes, plugins over gRPC, HTTP hooks and notifications, certificates, metrics."""
