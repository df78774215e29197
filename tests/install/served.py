"""The install's objects in the API versions an apiserver serves (the local one is 1.20).

manifests/install/pdb.yaml is `policy/v1` (Kubernetes 1.21 and later; `policy/v1beta1` is gone
in 1.25). The local kube-apiserver, Debian's 1.20, serves only `policy/v1beta1`. The fields the
install uses, `minAvailable` and a non-empty `selector`, have the same meaning in both versions
(k8s.io/api policy/v1/types.go and policy/v1beta1/types.go, PodDisruptionBudgetSpec; they differ
only for an empty selector, which v1beta1 reads as "no pods"), so on such a server the tests
check the budget as v1beta1.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.support.kube import KubeCluster
from tests.support.kubectl import kubectl

__all__ = ["PDB_V1_MISSING", "as_served", "serves_policy_v1"]

#: What `kubectl apply` says about the PodDisruptionBudget on an apiserver older than 1.21.
PDB_V1_MISSING = 'no matches for kind "PodDisruptionBudget" in version "policy/v1"'


def serves_policy_v1(cluster: KubeCluster) -> bool:
    """True when the apiserver serves policy/v1 (Kubernetes 1.21 and later)."""
    return "policy/v1" in kubectl(cluster, "api-versions").split()


def as_served(cluster: KubeCluster, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """docs, with each policy/v1 PodDisruptionBudget as policy/v1beta1 when the apiserver does
    not serve policy/v1; everything else unchanged."""
    if serves_policy_v1(cluster):
        return docs
    out = []
    for doc in docs:
        if doc["kind"] == "PodDisruptionBudget" and doc["apiVersion"] == "policy/v1":
            spec = doc["spec"]
            assert set(spec) <= {"minAvailable", "maxUnavailable", "selector"}, spec
            assert spec["selector"], "an empty selector differs between v1 and v1beta1"
            out.append({**copy.deepcopy(doc), "apiVersion": "policy/v1beta1"})
        else:
            out.append(doc)
    return out
