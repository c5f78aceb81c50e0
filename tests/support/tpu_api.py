"""A fake Cloud TPU REST API (``tpu.googleapis.com``) on 127.0.0.1.

Serves ``GET /{v1,v2alpha1,v2}/projects/{p}/locations/{zone}/nodes/{name}`` with node JSON as the
real API returns it: ``state``, ``health``, ``acceleratorType``, ``networkEndpoints``
(``ipAddress``, ``port``), the legacy top-level ``ipAddress``/``port`` of v1 nodes, and
``acceleratorConfig`` (v2). Unknown nodes get a 404 in Google's error shape; a node can be made
to answer 403 (the IAM error body the real API sends). Every request is recorded, including its
``Authorization`` header.

Example::

    with FakeTPUServer() as api:
        api.add_node("proj", "us-central2-b", "pod", endpoints=[("10.0.0.2", 8470)])
        ...  # TPUClusterResolver(tpu="pod", ..., api_endpoint=api.url)
"""

from __future__ import annotations

import re
from typing import Any

from ._http import FakeHTTPServer, Request, Response, google_error

__all__ = ["API_VERSIONS", "FakeTPUServer", "make_node"]

API_VERSIONS = ("v1", "v2alpha1", "v2")

_NODE_PATH = re.compile(
    r"^/(?P<version>[^/]+)/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
    r"/nodes/(?P<name>[^/]+)$"
)


def make_node(
    project: str,
    zone: str,
    name: str,
    *,
    endpoints: list[tuple[str, int]],
    state: str = "READY",
    health: str = "HEALTHY",
    accelerator_type: str = "v4-8",
    topology: str | None = "2x2x1",
    shape: str = "endpoints",
) -> dict[str, Any]:
    """Node JSON. ``shape``: ``"endpoints"`` (``networkEndpoints``, as v2 and current v1 nodes),
    ``"legacy"`` (only the deprecated top-level ``ipAddress``/``port`` of old v1 nodes), or
    ``"both"``."""
    if shape not in ("endpoints", "legacy", "both"):
        raise ValueError(f"unknown node shape {shape!r}")
    node: dict[str, Any] = {
        "name": f"projects/{project}/locations/{zone}/nodes/{name}",
        "acceleratorType": accelerator_type,
        "state": state,
        "health": health,
        "runtimeVersion": "tpu-ubuntu2204-base",
        "cidrBlock": "10.0.0.0/29",
        "createTime": "2025-01-01T00:00:00.000000Z",
        "schedulingConfig": {},
        "networkConfig": {"network": "default", "subnetwork": "default"},
        "apiVersion": "V2",
    }
    if topology is not None:
        version = accelerator_type.split("-")[0].upper()
        node["acceleratorConfig"] = {"type": version, "topology": topology}
    if shape in ("endpoints", "both"):
        node["networkEndpoints"] = [
            {"ipAddress": ip, "port": port, "accessConfig": {}} for ip, port in endpoints
        ]
    if shape in ("legacy", "both"):
        ip, port = endpoints[0]
        # v1 sent these deprecated fields as strings
        node["ipAddress"] = ip
        node["port"] = str(port)
    if state == "CREATING":
        # a node being created has no endpoints yet
        node.pop("networkEndpoints", None)
    return node


class FakeTPUServer(FakeHTTPServer):
    """Nodes keyed by ``(project, zone, name)``; ``forbidden`` names nodes that answer 403."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.forbidden: set[tuple[str, str, str]] = set()

    def add_node(self, project: str, zone: str, name: str, **kwargs: Any) -> dict[str, Any]:
        node = make_node(project, zone, name, **kwargs)
        self.nodes[(project, zone, name)] = node
        return node

    def handle(self, request: Request) -> Response:
        match = _NODE_PATH.match(request.path)
        if request.method != "GET" or match is None:
            return Response(
                404, google_error(404, f"Method not found: {request.method} {request.path}")
            )
        if match["version"] not in API_VERSIONS:
            return Response(404, google_error(404, f"API version {match['version']} not found"))
        key = (match["project"], match["zone"], match["name"])
        resource = f"projects/{key[0]}/locations/{key[1]}/nodes/{key[2]}"
        if key in self.forbidden:
            body = google_error(
                403,
                f"Permission 'tpu.nodes.get' denied on '{resource}'",
                details=[
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "IAM_PERMISSION_DENIED",
                        "domain": "tpu.googleapis.com",
                        "metadata": {"permission": "tpu.nodes.get", "resource": resource},
                    }
                ],
            )
            return Response(403, body)
        node = self.nodes.get(key)
        if node is None:
            body = google_error(
                404,
                f"Resource '{resource}' was not found",
                details=[
                    {
                        "@type": "type.googleapis.com/google.rpc.ResourceInfo",
                        "resourceName": resource,
                    }
                ],
            )
            return Response(404, body)
        return Response(200, node)
