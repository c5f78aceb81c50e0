"""A fake Compute Engine API (``compute.googleapis.com/compute/v1``) on 127.0.0.1.

Serves what ``GCEClusterResolver`` uses, in the real JSON shapes:

* ``POST /compute/v1/projects/{p}/zones/{z}/instanceGroups/{g}/listInstances`` with body
  ``{"instanceState": "ALL" | "RUNNING"}`` and query ``maxResults``/``pageToken``; answers
  ``compute#instanceGroupsListInstances`` pages (``items`` with ``instance`` URLs and
  ``status``; no ``items`` key on an empty page; ``nextPageToken`` while more remain).
* ``GET /compute/v1/projects/{p}/zones/{z}/instances/{name}`` → ``compute#instance`` with
  ``networkInterfaces[0].networkIP``.

Unknown groups/instances → 404 and a group listed in ``forbidden`` → 403, both in the Compute
error shape (``error.errors[].reason``). ``page_size`` caps every page, whatever the client asks.

Example::

    with FakeComputeServer() as api:
        api.add_instance("proj", "us-east1-b", "workers", "vm-1", "10.0.0.7")
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from ._http import FakeHTTPServer, Request, Response

__all__ = ["FakeComputeServer", "Instance", "instance_url"]

_ROOT = "https://www.googleapis.com/compute/v1"
_LIST = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)"
    r"/instanceGroups/(?P<group>[^/]+)/listInstances$"
)
_GET = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$"
)


def instance_url(project: str, zone: str, name: str) -> str:
    return f"{_ROOT}/projects/{project}/zones/{zone}/instances/{name}"


@dataclass
class Instance:
    name: str
    ip: str | None
    status: str = "RUNNING"


def _compute_error(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


class FakeComputeServer(FakeHTTPServer):
    """Instance groups keyed by ``(project, zone, group)``, members in insertion order."""

    def __init__(self, *, page_size: int = 500) -> None:
        super().__init__()
        self.page_size = page_size
        self.groups: dict[tuple[str, str, str], list[Instance]] = {}
        self.forbidden: set[tuple[str, str, str]] = set()

    def add_group(self, project: str, zone: str, group: str) -> None:
        self.groups.setdefault((project, zone, group), [])

    def add_instance(
        self,
        project: str,
        zone: str,
        group: str,
        name: str,
        ip: str | None,
        status: str = "RUNNING",
    ) -> None:
        self.add_group(project, zone, group)
        self.groups[(project, zone, group)].append(Instance(name, ip, status))

    def _find(self, project: str, zone: str, name: str) -> Instance | None:
        for (p, z, _), members in self.groups.items():
            if (p, z) == (project, zone):
                for inst in members:
                    if inst.name == name:
                        return inst
        return None

    def handle(self, request: Request) -> Response:
        if request.method == "POST" and (m := _LIST.match(request.path)):
            return self._list_instances(request, m["project"], m["zone"], m["group"])
        if request.method == "GET" and (m := _GET.match(request.path)):
            return self._get_instance(m["project"], m["zone"], m["name"])
        return Response(404, _compute_error(404, "notFound", f"no route {request.path}"))

    def _list_instances(self, request: Request, project: str, zone: str, group: str) -> Response:
        key = (project, zone, group)
        resource = f"projects/{project}/zones/{zone}/instanceGroups/{group}"
        if key in self.forbidden:
            message = f"Required 'compute.instanceGroups.list' permission for '{resource}'"
            return Response(403, _compute_error(403, "forbidden", message))
        if key not in self.groups:
            return Response(
                404, _compute_error(404, "notFound", f"The resource '{resource}' was not found")
            )
        state = (request.json() or {}).get("instanceState", "ALL")
        if state not in ("ALL", "RUNNING"):
            message = f"Invalid value for field 'resource.instanceState': '{state}'."
            return Response(400, _compute_error(400, "invalid", message))
        members = [i for i in self.groups[key] if state == "ALL" or i.status == "RUNNING"]
        try:
            start = _decode_token(request.query.get("pageToken", ""))
            size = min(int(request.query.get("maxResults", "500")), self.page_size)
        except ValueError as exc:
            return Response(400, _compute_error(400, "invalid", str(exc)))
        page = members[start : start + size]
        body: dict[str, Any] = {
            "kind": "compute#instanceGroupsListInstances",
            "id": str(abs(hash(key)) % 10**18),
            "selfLink": f"{_ROOT}/{resource}/listInstances",
        }
        if page:
            body["items"] = [
                {"instance": instance_url(project, zone, i.name), "status": i.status} for i in page
            ]
        if start + size < len(members):
            body["nextPageToken"] = _encode_token(start + size)
        return Response(200, body)

    def _get_instance(self, project: str, zone: str, name: str) -> Response:
        inst = self._find(project, zone, name)
        if inst is None:
            resource = f"projects/{project}/zones/{zone}/instances/{name}"
            return Response(
                404, _compute_error(404, "notFound", f"The resource '{resource}' was not found")
            )
        interfaces = []
        if inst.ip is not None:
            interfaces.append(
                {
                    "kind": "compute#networkInterface",
                    "name": "nic0",
                    "network": f"{_ROOT}/projects/{project}/global/networks/default",
                    "networkIP": inst.ip,
                    "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
                }
            )
        body = {
            "kind": "compute#instance",
            "id": str(abs(hash((project, zone, name))) % 10**18),
            "name": name,
            "status": inst.status,
            "zone": f"{_ROOT}/projects/{project}/zones/{zone}",
            "machineType": f"{_ROOT}/projects/{project}/zones/{zone}/machineTypes/n2-standard-8",
            "networkInterfaces": interfaces,
            "selfLink": instance_url(project, zone, name),
        }
        return Response(200, body)


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset={offset}".encode()).decode()


def _decode_token(token: str) -> int:
    if not token:
        return 0
    try:
        text = base64.urlsafe_b64decode(token.encode()).decode()
        return int(text.removeprefix("offset="))
    except Exception as exc:
        raise ValueError(f"Invalid value for field 'pageToken': '{token}'.") from exc
