"""A Route 53 emulator for tests: the three record-set operations the EKS plugin's traffic drain
uses, served on loopback in Route 53's rest-xml protocol, so boto3 talks to it unchanged:

    boto3.client("route53", endpoint_url=emulator.endpoint)

Paths, shapes and error codes follow botocore's service model,
botocore/data/route53/2013-04-01/service-2.json: ListResourceRecordSets
(GET /2013-04-01/hostedzone/{Id}/rrset?name=&type=&identifier=&maxitems=),
ChangeResourceRecordSets (POST /2013-04-01/hostedzone/{Id}/rrset/, a
ChangeResourceRecordSetsRequest document), GetChange (GET /2013-04-01/change/{Id}). Errors are
rest-xml ErrorResponse documents (botocore/parsers.py RestXMLParser reads Error/Code).
"""

from __future__ import annotations

import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from tests.support.eks_emulator._http import Answer, LoopbackServer

__all__ = ["Route53Emulator"]

_NS = "https://route53.amazonaws.com/doc/2013-04-01/"
FAULTS = {"Throttling": 400, "PriorRequestNotComplete": 400, "ServiceUnavailable": 503}
"""Transient errors a test may inject (service-2.json: ThrottlingException and
PriorRequestNotComplete are HTTP 400 in Route 53; 5xx is any server error)."""


class _Error(Exception):
    def __init__(self, code: str, status: int, message: str) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


def _fqdn(name: str) -> str:
    return name if name.endswith(".") else name + "."


def _order(record: Mapping[str, Any]) -> tuple[tuple[str, ...], str, str]:
    # ListResourceRecordSets: "sorted by name ... with the labels reversed" (so
    # www.example.com sorts as com.example.www), then by type, then by SetIdentifier.
    labels = tuple(reversed(record["Name"].rstrip(".").split(".")))
    return labels, record["Type"], record.get("SetIdentifier", "")


class Route53Emulator:
    """Route 53 on loopback: hosted zones of record sets, changes PENDING then INSYNC after
    sync_seconds, injectable faults. Use as a context manager."""

    def __init__(self, sync_seconds: float = 0.2) -> None:
        self.sync_seconds = sync_seconds
        self._lock = threading.RLock()
        self._zones: dict[str, list[dict[str, Any]]] = {}
        self._changes: dict[str, float] = {}
        self._faults: dict[str, list[str]] = {}
        self._calls: Counter[str] = Counter()
        self._server = LoopbackServer(self._dispatch)

    def __enter__(self) -> Route53Emulator:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    @property
    def endpoint(self) -> str:
        return self._server.endpoint

    # ------------------------------------------------------------------ set-up, inspection

    def add_weighted(
        self, zone: str, name: str, identifier: str, weight: int, value: str, ttl: int = 60
    ) -> None:
        """A weighted A record set (SetIdentifier, Weight, TTL, one value)."""
        with self._lock:
            self._zones.setdefault(zone, []).append(
                {
                    "Name": _fqdn(name),
                    "Type": "A",
                    "SetIdentifier": identifier,
                    "Weight": weight,
                    "TTL": ttl,
                    "ResourceRecords": [value],
                }
            )

    def weight(self, zone: str, name: str, identifier: str) -> int | None:
        """The weight of a record set now; None when there is none."""
        with self._lock:
            for record in self._zones.get(zone, []):
                if record["Name"] == _fqdn(name) and record.get("SetIdentifier") == identifier:
                    return int(record["Weight"])
            return None

    def inject(self, operation: str, error: str, count: int = 1) -> None:
        """The next count calls of operation answer error (one of FAULTS)."""
        with self._lock:
            self._faults.setdefault(operation, []).extend([error] * count)

    def calls(self, operation: str) -> int:
        with self._lock:
            return self._calls[operation]

    def called(self) -> set[str]:
        with self._lock:
            return {name for name, count in self._calls.items() if count}

    # ------------------------------------------------------------------ the wire

    def _dispatch(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        body: bytes,
    ) -> Answer:
        parts = path.strip("/").split("/")
        try:
            with self._lock:
                if method == "GET" and parts[:2] == ["2013-04-01", "change"] and len(parts) == 3:
                    return self._call("GetChange", lambda: self._get_change(parts[2]))
                if parts[:2] == ["2013-04-01", "hostedzone"] and len(parts) == 4:
                    zone = parts[2]
                    if method == "GET":
                        return self._call("ListResourceRecordSets", lambda: self._list(zone, query))
                    if method == "POST":
                        return self._call(
                            "ChangeResourceRecordSets", lambda: self._change(zone, body)
                        )
            raise _Error("InvalidInput", 400, f"no route {method} {path}")
        except _Error as err:
            root = ET.Element("ErrorResponse", xmlns=_NS)
            error = ET.SubElement(root, "Error")
            ET.SubElement(error, "Type").text = "Sender" if err.status < 500 else "Receiver"
            ET.SubElement(error, "Code").text = err.code
            ET.SubElement(error, "Message").text = err.message
            ET.SubElement(root, "RequestId").text = str(uuid.uuid4())
            return err.status, {"Content-Type": "text/xml"}, ET.tostring(root)

    def _call(self, name: str, handler: Any) -> Answer:
        self._calls[name] += 1
        faults = self._faults.get(name)
        if faults:
            fault = faults.pop(0)
            raise _Error(fault, FAULTS[fault], "Rate exceeded")
        root: ET.Element = handler()
        return 200, {"Content-Type": "text/xml"}, ET.tostring(root)

    def _zone(self, zone: str) -> list[dict[str, Any]]:
        if zone not in self._zones:
            raise _Error("NoSuchHostedZone", 404, f"No hosted zone found with ID: {zone}")
        return self._zones[zone]

    def _list(self, zone: str, query: dict[str, list[str]]) -> ET.Element:
        records = sorted(self._zone(zone), key=_order)
        name = query.get("name", [""])[0]
        if name:
            start = (
                tuple(reversed(_fqdn(name).rstrip(".").split("."))),
                query.get("type", [""])[0],
                query.get("identifier", [""])[0],
            )
            records = [r for r in records if _order(r) >= start]
        size = int(query.get("maxitems", ["300"])[0])
        root = ET.Element("ListResourceRecordSetsResponse", xmlns=_NS)
        sets = ET.SubElement(root, "ResourceRecordSets")
        for record in records[:size]:
            sets.append(_record_xml(record))
        ET.SubElement(root, "IsTruncated").text = "true" if len(records) > size else "false"
        if len(records) > size:
            following = records[size]
            ET.SubElement(root, "NextRecordName").text = following["Name"]
            ET.SubElement(root, "NextRecordType").text = following["Type"]
            if following.get("SetIdentifier"):
                ET.SubElement(root, "NextRecordIdentifier").text = following["SetIdentifier"]
        ET.SubElement(root, "MaxItems").text = str(size)
        return root

    def _change(self, zone: str, body: bytes) -> ET.Element:
        records = self._zone(zone)
        doc = ET.fromstring(body)
        changes = doc.findall(f".//{{{_NS}}}Change")
        updated = list(records)
        for change in changes:
            action = change.findtext(f"{{{_NS}}}Action", "")
            record = _record_of(change.find(f"{{{_NS}}}ResourceRecordSet"))
            key = (record["Name"], record["Type"], record.get("SetIdentifier", ""))
            index = next(
                (
                    i
                    for i, r in enumerate(updated)
                    if (r["Name"], r["Type"], r.get("SetIdentifier", "")) == key
                ),
                None,
            )
            if "Weight" in record and not 0 <= record["Weight"] <= 255:
                # ResourceRecordSetWeight: min 0, max 255.
                raise _Error("InvalidChangeBatch", 400, "Weight must be between 0 and 255")
            if "Weight" in record and not record.get("SetIdentifier"):
                raise _Error("InvalidChangeBatch", 400, "Weighted records need a SetIdentifier")
            # The batch is all or nothing (ChangeResourceRecordSets: "the changes are applied
            # as a single transaction"): errors leave the zone as it was.
            if action == "UPSERT":
                if index is None:
                    updated.append(record)
                else:
                    updated[index] = record
            elif action == "CREATE" and index is None:
                updated.append(record)
            elif action == "DELETE" and index is not None:
                del updated[index]
            else:
                raise _Error("InvalidChangeBatch", 400, f"{action} of {key} not allowed")
        self._zones[zone] = updated
        change_id = "C" + uuid.uuid4().hex[:12].upper()
        self._changes[change_id] = time.monotonic()
        root = ET.Element("ChangeResourceRecordSetsResponse", xmlns=_NS)
        root.append(self._change_info(change_id))
        return root

    def _get_change(self, change_id: str) -> ET.Element:
        if change_id not in self._changes:
            raise _Error(
                "NoSuchChange",
                404,
                f"A change with the specified change ID does not exist: {change_id}",
            )
        root = ET.Element("GetChangeResponse", xmlns=_NS)
        root.append(self._change_info(change_id))
        return root

    def _change_info(self, change_id: str) -> ET.Element:
        # ChangeInfo.Status: PENDING until the change reached every Route 53 server, INSYNC after.
        submitted = self._changes[change_id]
        info = ET.Element("ChangeInfo")
        ET.SubElement(info, "Id").text = f"/change/{change_id}"
        in_sync = time.monotonic() - submitted >= self.sync_seconds
        ET.SubElement(info, "Status").text = "INSYNC" if in_sync else "PENDING"
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        ET.SubElement(info, "SubmittedAt").text = at
        return info


def _record_xml(record: Mapping[str, Any]) -> ET.Element:
    element = ET.Element("ResourceRecordSet")
    for field in ("Name", "Type", "SetIdentifier", "Weight", "TTL"):
        if field in record:
            ET.SubElement(element, field).text = str(record[field])
    values = ET.SubElement(element, "ResourceRecords")
    for value in record.get("ResourceRecords", []):
        ET.SubElement(ET.SubElement(values, "ResourceRecord"), "Value").text = value
    return element


def _record_of(element: ET.Element | None) -> dict[str, Any]:
    if element is None:
        raise _Error("InvalidInput", 400, "ResourceRecordSet is required")
    record: dict[str, Any] = {}
    for field in ("Name", "Type", "SetIdentifier"):
        text = element.findtext(f"{{{_NS}}}{field}")
        if text:
            record[field] = _fqdn(text) if field == "Name" else text
    for field in ("Weight", "TTL"):
        text = element.findtext(f"{{{_NS}}}{field}")
        if text is not None:
            record[field] = int(text)
    record["ResourceRecords"] = [v.text or "" for v in element.iter(f"{{{_NS}}}Value")]
    if "Name" not in record or "Type" not in record:
        raise _Error("InvalidInput", 400, "Name and Type are required")
    return record
