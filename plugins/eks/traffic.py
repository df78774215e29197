"""Traffic drain through Route 53 weighted records: ServiceOut sets the cluster's records to
weight 0, ServiceIn back to their configured weight; the change is done when Route 53 reports
it INSYNC and resolvers had the records' TTL to forget the old answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from plugins.eks.api import call, client_config
from plugins.eks.config import EksConfig, WeightedRecord
from plugins.sdk import FailedPrecondition

__all__ = ["Drain", "Route53Traffic"]

ALIAS_TTL_SECONDS = 60.0
"""How long an alias record is cached: Route 53 answers alias records with the target's TTL,
which the plugin cannot read; 60 s is what AWS load balancers' records use."""


@dataclass
class Drain:
    """A weight change in flight: Route 53's change ids and how long to wait after INSYNC."""

    change_ids: list[str]
    wait_seconds: float
    in_sync_at: float | None = None
    synced: set[str] = field(default_factory=set)


def _key(record: WeightedRecord) -> str:
    return f"{record.name} {record.type} {record.set_identifier} (zone {record.hosted_zone_id})"


class Route53Traffic:
    """The weighted records of each cluster, read and changed through boto3's route53 client."""

    def __init__(self, config: EksConfig, session: Any) -> None:
        route53 = config.traffic.route53
        assert route53 is not None, "mode route53 is validated to have records"
        self._records: Mapping[str, list[WeightedRecord]] = route53.records
        # One change at a time: the "not the last non-zero weight" check reads the group, so
        # two clusters of one group drained at once must not both see the other serving.
        self._changing = threading.Lock()
        self._drain_seconds = route53.drain_seconds
        # Route 53 is global; any region of the partition resolves its global endpoint.
        self._client = session.client(
            "route53",
            region_name=config.regions[0],
            endpoint_url=route53.endpoint or None,
            config=client_config(config),
        )

    def close(self) -> None:
        self._client.close()

    def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        return call(self._client, "Route53", operation, "", **params)

    def _configured(self, cluster_id: str) -> list[WeightedRecord]:
        records = self._records.get(cluster_id)
        if not records:
            raise FailedPrecondition(
                f"traffic.route53.records has no weighted record for cluster {cluster_id}; "
                "add the records that send it traffic"
            )
        return records

    def _group(self, record: WeightedRecord) -> list[dict[str, Any]]:
        """Every record set with the record's name and type (the weighted group), read from
        the record's name onwards (ListResourceRecordSets pages in name, type, id order)."""
        found: list[dict[str, Any]] = []
        params: dict[str, Any] = {
            "HostedZoneId": record.hosted_zone_id,
            "StartRecordName": record.name,
            "StartRecordType": record.type,
        }
        while True:
            page = self._call("list_resource_record_sets", **params)
            for candidate in page.get("ResourceRecordSets", []):
                if candidate.get("Name") != record.name or candidate.get("Type") != record.type:
                    return found
                found.append(candidate)
            if not page.get("IsTruncated"):
                return found
            params["StartRecordName"] = page["NextRecordName"]
            params["StartRecordType"] = page["NextRecordType"]
            if page.get("NextRecordIdentifier"):
                params["StartRecordIdentifier"] = page["NextRecordIdentifier"]

    @staticmethod
    def _own(record: WeightedRecord, group: list[dict[str, Any]]) -> dict[str, Any]:
        for candidate in group:
            if candidate.get("SetIdentifier") == record.set_identifier:
                return candidate
        raise FailedPrecondition(
            f"Route 53 has no record {_key(record)}; fix traffic.route53.records or create it"
        )

    def state(self, cluster_id: str) -> tuple[bool, str]:
        """(in service, problem): in service when every record of the cluster has a weight
        above 0; a problem ("" when none) when a record is missing."""
        serving = True
        for record in self._configured(cluster_id):
            try:
                own = self._own(record, self._group(record))
            except FailedPrecondition as exc:
                return False, exc.message
            serving = serving and int(own.get("Weight", 0)) > 0
        return serving, ""

    def change(self, cluster_id: str, out: bool) -> Drain | None:
        """Sets the cluster's records to weight 0 (out) or their weight; None when they are
        there already. Refuses to zero the last non-zero weight of a group: Route 53 answers
        a group whose weights are all 0 with every record equally, which drains nothing."""
        with self._changing:
            return self._change(cluster_id, out)

    def _change(self, cluster_id: str, out: bool) -> Drain | None:
        by_zone: dict[str, list[dict[str, Any]]] = {}
        ttls: list[float] = []
        for record in self._configured(cluster_id):
            group = self._group(record)
            own = self._own(record, group)
            target = 0 if out else record.weight
            if int(own.get("Weight", -1)) == target:
                continue
            if out:
                others = [
                    g
                    for g in group
                    if g.get("SetIdentifier") != record.set_identifier
                    and int(g.get("Weight", 0)) > 0
                ]
                if not others:
                    raise FailedPrecondition(
                        f"ServiceOut would set the last non-zero weight of {record.name} "
                        f"{record.type} to 0; Route 53 then answers with every record of the "
                        "group equally, so nothing would drain; put another cluster's record "
                        "in service first"
                    )
            updated = dict(own)
            updated["Weight"] = target
            by_zone.setdefault(record.hosted_zone_id, []).append(
                {"Action": "UPSERT", "ResourceRecordSet": updated}
            )
            ttls.append(float(own["TTL"]) if "TTL" in own else ALIAS_TTL_SECONDS)
        if not by_zone:
            return None
        change_ids = []
        for zone, changes in sorted(by_zone.items()):
            answer = self._call(
                "change_resource_record_sets",
                HostedZoneId=zone,
                ChangeBatch={"Comment": f"fleet-upgrade {cluster_id}", "Changes": changes},
            )
            change_ids.append(str(answer["ChangeInfo"]["Id"]))
        wait = self._drain_seconds if self._drain_seconds is not None else max(ttls)
        return Drain(change_ids, wait)

    def done(self, drain: Drain) -> bool:
        """True once every change is INSYNC and the wait after it has passed."""
        for change_id in drain.change_ids:
            if change_id in drain.synced:
                continue
            status = self._call("get_change", Id=change_id)["ChangeInfo"]["Status"]
            if status != "INSYNC":
                return False
            drain.synced.add(change_id)
        if drain.in_sync_at is None:
            drain.in_sync_at = time.monotonic()
        return time.monotonic() - drain.in_sync_at >= drain.wait_seconds
