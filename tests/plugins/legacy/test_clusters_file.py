"""--clusters-file accepts a list of ids, {id, labels} entries, {clusters: [...]}, and the
original operator's ClusterVersion manifest; anything else is refused naming where."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugins.legacy.inventory import load_clusters_file

SEED = """\
apiVersion: multicluster-ops.io/v1
kind: ClusterVersion
metadata: {name: fleet}
spec:
  requiredAvailableCount: 1
  opsEndpoint: {endpoint: "plugin:8080", insecure: true}
  clusters:
  - {id: projects/p/locations/l/clusters/a, version: 1.29.1}
  - {id: projects/p/locations/l/clusters/b, version: 1.29.1}
---
- projects/p/locations/l/clusters/c
- id: projects/p/locations/l/clusters/d
  labels: {stage: canary}
---
clusters: [projects/p/locations/l/clusters/e]
"""


def test_every_accepted_shape_is_read(tmp_path: Path) -> None:
    path = tmp_path / "clusters.yaml"
    path.write_text(SEED)
    clusters = load_clusters_file(str(path))
    prefix = "projects/p/locations/l/clusters/"
    assert clusters == {
        f"{prefix}a": {},
        f"{prefix}b": {},
        f"{prefix}c": {},
        f"{prefix}d": {"stage": "canary"},
        f"{prefix}e": {},
    }


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("spec: {clusters: {a: 1}}", "document 1.spec.clusters: expected a list"),
        ("- ''", "document 1[0]: must be a non-empty cluster id"),
        ("- {id: a, labels: {x: 1}}", "document 1[0].labels: must map strings to strings"),
        ("clusters: [a]\n---\n- {name: b}", "document 2[0]: must be a non-empty cluster id"),
        ("[a, b", "is not YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_entry(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "clusters.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="--clusters-file: ") as caught:
        load_clusters_file(str(path))
    assert where in str(caught.value)
