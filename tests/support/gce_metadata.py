"""A fake GCE metadata server (``/computeMetadata/v1/...``) on 127.0.0.1.

It behaves like the real one where clients can tell: it requires the request header
``Metadata-Flavor: Google`` (403 without it, or when ``X-Forwarded-For`` shows a proxy), sends
``Metadata-Flavor: Google`` on every answer, serves values as ``application/text``, lists a
directory for a path ending in ``/``, and answers 404 for unknown keys. ``garbage = True`` turns
it into something that is *not* a metadata server (an HTML page, no ``Metadata-Flavor``), like a
captive portal answering for ``metadata.google.internal``; ``delay`` makes it slow.

Example::

    with FakeMetadataServer(attributes=tpu_vm_attributes(["10.0.0.2", "10.0.0.3"], 1)) as md:
        monkeypatch.setenv("GCE_METADATA_HOST", md.host)
        ...
"""

from __future__ import annotations

from typing import Any

from ._http import FakeHTTPServer, Request, Response

__all__ = ["FakeMetadataServer", "tpu_vm_attributes", "worker_network_endpoints"]

_PREFIX = "/computeMetadata/v1/"


def worker_network_endpoints(ips: list[str], fmt: str = "triples") -> str:
    """The ``worker-network-endpoints`` attribute a TPU VM shows, in one of its two formats.

    ``"triples"``: ``unknown:unknown:<ip>`` entries joined by commas (what current TPU VMs
    serve and what JAX's ``GceTpuCluster`` reads field 2 of); ``"ips"``: plain ``<ip>`` entries.
    """
    if fmt == "triples":
        return ",".join(f"unknown:unknown:{ip}" for ip in ips)
    if fmt == "ips":
        return ",".join(ips)
    raise ValueError(f"unknown worker-network-endpoints format {fmt!r}; use 'triples' or 'ips'")


def tpu_vm_attributes(
    ips: list[str],
    worker: int,
    *,
    accelerator_type: str = "v4-16",
    topology: str = "2x2x2",
    node_name: str = "my-tpu",
    zone: str = "us-central2-b",
    fmt: str = "triples",
) -> dict[str, str]:
    """Instance attributes of worker ``worker`` of a TPU VM slice whose hosts are ``ips``."""
    tpu_env = "\n".join(
        [
            f"ACCELERATOR_TYPE: '{accelerator_type}'",
            "CHIPS_PER_HOST_BOUNDS: '2,2,1'",
            f"HOST_BOUNDS: '1,1,{len(ips)}'",
            f"NODE_ID: '{node_name}'",
            f"TOPOLOGY: '{topology}'",
            f"WORKER_ID: '{worker}'",
            f"ZONE: '{zone}'",
        ]
    )
    return {
        "accelerator-type": accelerator_type,
        "agent-worker-number": str(worker),
        "worker-network-endpoints": worker_network_endpoints(ips, fmt),
        "tpu-env": tpu_env + "\n",
    }


class FakeMetadataServer(FakeHTTPServer):
    """The GCE metadata server of one VM. Mutate the public fields between requests freely."""

    def __init__(
        self,
        *,
        project_id: str = "test-project",
        project_number: str = "123456789012",
        zone: str = "us-central2-b",
        ip: str = "10.128.0.2",
        hostname: str = "t1v-n-test-w-0",
        attributes: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.project_id = project_id
        self.project_number = project_number
        self.zone = zone
        self.ip = ip
        self.hostname = hostname
        self.attributes: dict[str, str] = dict(attributes or {})
        self.garbage = False

    def values(self) -> dict[str, str]:
        """Every key served, path relative to ``/computeMetadata/v1/``."""
        out = {
            "project/project-id": self.project_id,
            "project/numeric-project-id": self.project_number,
            "instance/zone": f"projects/{self.project_number}/zones/{self.zone}",
            "instance/hostname": f"{self.hostname}.{self.zone}.c.{self.project_id}.internal",
            "instance/name": self.hostname,
            "instance/network-interfaces/0/ip": self.ip,
        }
        out.update({f"instance/attributes/{k}": v for k, v in self.attributes.items()})
        return out

    def handle(self, request: Request) -> Response:
        if self.garbage:
            page = "<html><body><h1>Welcome to the hotel Wi-Fi</h1></body></html>"
            return Response(200, page, {"Content-Type": "text/html"})
        flavor = {"Metadata-Flavor": "Google"}
        if request.headers.get("metadata-flavor") != "Google":
            body = (
                "Your client does not have permission to get URL "
                f"<code>{request.path}</code> from this server. "
                "Missing Metadata-Flavor:Google header."
            )
            return Response(403, body, {**flavor, "Content-Type": "text/html"})
        if "x-forwarded-for" in request.headers:
            return Response(403, "Request had an X-Forwarded-For header.", flavor)
        if request.method != "GET" or not request.path.startswith(_PREFIX):
            return _not_found(request.path)
        key = request.path[len(_PREFIX) :]
        values = self.values()
        if key.endswith("/") or key == "":
            children = _children(values, key)
            if not children:
                return _not_found(request.path)
            return Response(200, "\n".join(children) + "\n", _text(flavor))
        if key in values:
            return Response(200, values[key], _text(flavor))
        return _not_found(request.path)


def _children(values: dict[str, Any], directory: str) -> list[str]:
    names: set[str] = set()
    for key in values:
        if key.startswith(directory):
            head, sep, _ = key[len(directory) :].partition("/")
            names.add(head + sep)
    return sorted(names)


def _text(headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "Content-Type": "application/text"}


def _not_found(path: str) -> Response:
    page = f"<html><body><p>The requested URL <code>{path}</code> was not found.</p></body></html>"
    return Response(404, page, {"Metadata-Flavor": "Google", "Content-Type": "text/html"})
