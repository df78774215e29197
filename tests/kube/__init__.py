"""Acceptance tests of the local control plane against the real kube-apiserver and etcd."""
