"""Issue 19, symptom 1: one plugin reached by two addresses is one provider.

Two teams' FleetProviders name the same sim plugin, one as 127.0.0.1:PORT and one as
localhost:PORT. A strict ClusterVersion in one namespace and a loose one in another roll the same
clusters at once: the strict floor holds and every cluster is upgraded by one run only, because
holdings and floors are keyed by what the plugin says it is (GetPluginInfo fleet_id), not by how
its address is spelled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from orchestrator import api
from tests.e2e.conftest import (
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    reconcile_errors,
)
from tests.support.kube import KubeCluster, wait_for

CLUSTERS = 10
STRICT = 8


@contextmanager
def fleet_provider(objects: Objects, name: str, endpoint: str, ns: str) -> Iterator[str]:
    """A FleetProvider the platform admin declares for one namespace (deleted afterwards)."""
    objects.api.create_cluster_custom_object(
        api.GROUP,
        api.VERSION,
        api.FLEET_PROVIDER_PLURAL,
        {
            "apiVersion": api.API_VERSION,
            "kind": api.FLEET_PROVIDER_KIND,
            "metadata": {"name": name},
            "spec": {"endpoint": endpoint, "insecure": True, "allowedNamespaces": {"names": [ns]}},
        },
    )
    try:
        yield name
    finally:
        objects.api.delete_cluster_custom_object(
            api.GROUP, api.VERSION, api.FLEET_PROVIDER_PLURAL, name
        )


def _via(name: str, provider: str, required: int, concurrency: int) -> dict[str, object]:
    body = cluster_version(
        name, "unused:1", ids(CLUSTERS), required, strategy={"maxConcurrency": concurrency}
    )
    spec = body["spec"]
    assert isinstance(spec, dict)
    del spec["opsEndpoint"]
    spec["providerRef"] = {"name": provider}
    return body


def test_two_addresses_of_one_plugin_keep_the_strict_floor(
    control_plane: KubeCluster,
    sim: Callable[..., Sim],
    objects: Objects,
    orchestrators: Orchestrators,
) -> None:
    fleet = sim(fleet_file(CLUSTERS, step=0.3))
    host, _, port = fleet.address.rpartition(":")
    assert host == "127.0.0.1", fleet.address
    with control_plane.temporary_namespace("team-b") as other_ns:
        other = Objects(control_plane, other_ns)
        try:
            with (
                fleet_provider(
                    objects, f"a-{objects.ns}"[:63], f"127.0.0.1:{port}", objects.ns
                ) as strict_provider,
                fleet_provider(
                    objects, f"b-{other_ns}"[:63], f"localhost:{port}", other_ns
                ) as loose_provider,
            ):
                # No inline endpoints anywhere: each team reaches the plugin by its provider.
                orchestrators.start("--allow-inline-endpoints-in", "nowhere", all_namespaces=True)
                objects.create_cv(_via("strict", strict_provider, STRICT, 2))
                other.create_cv(_via("loose", loose_provider, 3, 7))
                wait_for(
                    "the strict ClusterVersion completes",
                    lambda: objects.cv_phase_is("strict", "Completed"),
                    timeout=150,
                    interval=0.3,
                )
                wait_for(
                    "the loose ClusterVersion completes",
                    lambda: other.cv_phase_is("loose", "Completed"),
                    timeout=90,
                    interval=0.3,
                )
                strict = objects.upgrades(objects.current_run("strict"))
                loose = other.upgrades(other.current_run("loose"))
                errors = reconcile_errors(orchestrators.logs())
        finally:
            other.client.close()
    m = fleet.monitor()
    # Available-and-in-service never fell below the strict floor, whoever took clusters out.
    assert m["min_available_in_service"] >= STRICT, m
    assert m["clusters_at_target"] == CLUSTERS and m["available_in_service"] == CLUSTERS, m
    # One owner: each cluster was upgraded once, by one of the two runs.
    assert m["duplicate_mutations"] == 0 and m["mutations_total"] == CLUSTERS * 5, m
    for cid in ids(CLUSTERS):
        phases = {strict[cid]["status"]["phase"], loose[cid]["status"]["phase"]}
        assert phases == {"Upgraded", "Skipped"}, (cid, phases)
    # Both runs pinned the same provider identity, whichever address they used.
    pinned = {u["spec"]["providerId"] for u in [*strict.values(), *loose.values()]}
    spelled = {u["spec"]["provider"] for u in [*strict.values(), *loose.values()]}
    assert len(pinned) == 1 and spelled == {f"127.0.0.1:{port}", f"localhost:{port}"}, (
        pinned,
        spelled,
    )
    assert not errors
