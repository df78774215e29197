"""An STS emulator for tests: AssumeRoleWithWebIdentity, the call boto3's default chain makes
for IRSA (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE), served on loopback in STS's query
protocol. boto3 reaches it through AWS_ENDPOINT_URL_STS, unchanged otherwise.

Shapes from botocore/data/sts/2011-06-15/service-2.json: POST / with form fields Action,
Version, RoleArn, RoleSessionName, WebIdentityToken; the answer is an
AssumeRoleWithWebIdentityResponse document whose AssumeRoleWithWebIdentityResult carries
Credentials (AccessKeyId, SecretAccessKey, SessionToken, Expiration).
"""

from __future__ import annotations

import secrets
import threading
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

from tests.support.eks_emulator._http import Answer, LoopbackServer

__all__ = ["StsEmulator"]

_NS = "https://sts.amazonaws.com/doc/2011-06-15/"


class StsEmulator:
    """Issues fresh session credentials for any role and token; remembers what it was sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.assumed: list[dict[str, str]] = []  # the form fields of each call
        self.issued: list[dict[str, str]] = []  # the credentials handed out
        self._server = LoopbackServer(self._dispatch)

    def __enter__(self) -> StsEmulator:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    @property
    def endpoint(self) -> str:
        return self._server.endpoint

    def _dispatch(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        body: bytes,
    ) -> Answer:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        if method != "POST" or form.get("Action") != "AssumeRoleWithWebIdentity":
            return 400, {"Content-Type": "text/xml"}, b"<ErrorResponse/>"
        credentials = {
            "AccessKeyId": "ASIA" + secrets.token_hex(8).upper(),
            "SecretAccessKey": secrets.token_urlsafe(30),
            "SessionToken": secrets.token_urlsafe(60),
            "Expiration": (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        with self._lock:
            self.assumed.append(form)
            self.issued.append(credentials)
        root = ET.Element("AssumeRoleWithWebIdentityResponse", xmlns=_NS)
        result = ET.SubElement(root, "AssumeRoleWithWebIdentityResult")
        creds = ET.SubElement(result, "Credentials")
        for key, value in credentials.items():
            ET.SubElement(creds, key).text = value
        user = ET.SubElement(result, "AssumedRoleUser")
        ET.SubElement(user, "Arn").text = (
            form.get("RoleArn", "") + "/" + form.get("RoleSessionName", "")
        )
        ET.SubElement(user, "AssumedRoleId").text = "AROAEXAMPLE:" + form.get("RoleSessionName", "")
        ET.SubElement(result, "SubjectFromWebIdentityToken").text = "system:serviceaccount:x:y"
        meta = ET.SubElement(root, "ResponseMetadata")
        ET.SubElement(meta, "RequestId").text = secrets.token_hex(8)
        return 200, {"Content-Type": "text/xml"}, ET.tostring(root)
