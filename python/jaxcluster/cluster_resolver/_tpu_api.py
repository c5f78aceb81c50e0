"""Cloud TPU REST API: read one node and turn it into worker endpoints.

``GET {root}/{version}/projects/{project}/locations/{zone}/nodes/{name}``, version ``v2`` by
default (``v1`` and ``v2alpha1`` available). The root is ``api_endpoint=`` when given, else the
host of ``TPU_API_DISCOVERY_URL`` / ``discovery_url=`` (accepted for TF compatibility: the REST
root is taken from it, the discovery document is not fetched), else
``https://tpu.googleapis.com/``.

Example::

    api = TpuNodeApi(root="https://tpu.googleapis.com/", api_version="v2", credentials="default")
    node = api.get_node("my-project", "us-central2-b", "my-tpu")
    node_endpoints(node, "my-tpu")    # [('10.130.0.2', 8470), ...]
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from jaxcluster.cluster_resolver._discovery import execute, is_discovery_client
from jaxcluster.cluster_resolver._google import DEFAULT_API_TIMEOUT, GoogleAPI, check_base_url
from jaxcluster.cluster_resolver._tpu_names import DEFAULT_TPU_PORT

__all__ = [
    "API_VERSIONS",
    "DEFAULT_TPU_API",
    "TpuNodeApi",
    "api_root",
    "node_endpoints",
    "node_topology",
]

API_VERSIONS = ("v1", "v2alpha1", "v2")
DEFAULT_TPU_API = "https://tpu.googleapis.com/"
_NOT_READY_ADVICE = {
    "CREATING": "It is still being created; retry in a minute.",
    "STARTING": "It is starting; retry in a minute.",
    "RESTARTING": "It is restarting; retry in a minute.",
    "REPAIRING": "Cloud TPU is repairing it; retry later.",
    "STOPPING": "It is stopping; start it again with `gcloud compute tpus tpu-vm start`.",
    "STOPPED": "Start it with `gcloud compute tpus tpu-vm start`.",
    "PREEMPTED": "It was preempted; delete and recreate it.",
    "TERMINATED": "It was terminated; delete and recreate it.",
    "DELETING": "It is being deleted.",
}


def _root_from_discovery(url: str, source: str) -> str:
    """``https://host/`` (plus any path prefix) from a discovery document URL such as
    ``https://tpu.googleapis.com/$discovery/rest?version=v1``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"{source} is {url!r}; expected an http(s) URL such as "
            "'https://tpu.googleapis.com/$discovery/rest?version=v1'"
        )
    path = parts.path
    for marker in ("/$discovery", "/discovery/"):
        if marker in path:
            path = path[: path.index(marker)]
            break
    else:
        path = ""
    return urlunsplit((parts.scheme, parts.netloc, path.rstrip("/") + "/", "", ""))


def api_root(api_endpoint: str | None, discovery_url: str | None) -> tuple[str, str]:
    """``(root URL, where it came from)``: ``api_endpoint``, then ``TPU_API_DISCOVERY_URL``
    (which TF also lets override ``discovery_url``), then ``discovery_url``, then the default."""
    if api_endpoint is not None:
        root = check_base_url(api_endpoint, "api_endpoint")
        last = root.rstrip("/").rsplit("/", 1)[-1]
        if last in API_VERSIONS and root.count("/") > 3:  # a versioned base such as .../v2/
            root = root[: -len(last) - 1]
        return root, "api_endpoint"
    env = os.environ.get("TPU_API_DISCOVERY_URL", "").strip()
    if env:
        return _root_from_discovery(env, "TPU_API_DISCOVERY_URL"), "TPU_API_DISCOVERY_URL"
    if discovery_url is not None:
        return _root_from_discovery(discovery_url, "discovery_url"), "discovery_url"
    return DEFAULT_TPU_API, "the default endpoint"


class TpuNodeApi:
    """Reads nodes from the Cloud TPU API; a failed lookup is a ``ValueError`` naming the node."""

    def __init__(
        self,
        *,
        root: str,
        api_version: str,
        credentials: object,
        service: object,
        timeout: float = DEFAULT_API_TIMEOUT,
    ) -> None:
        if api_version not in API_VERSIONS:
            raise ValueError(
                f"api_version is {api_version!r}; expected one of {', '.join(API_VERSIONS)}"
            )
        self.api_version = api_version
        # TF's discovery client, called as TF calls it; else the REST API (service= a Session).
        # TF's googleapiclient discovery client, called as TF calls it (duck-typed).
        self._client: Any = service if is_discovery_client(service, "projects") else None
        self.api = GoogleAPI(
            "Cloud TPU API",
            root,
            credentials=credentials,
            service=None if self._client is not None else service,
            timeout=timeout,
        )

    def node_path(self, project: str, zone: str, name: str) -> str:
        return f"{self.api_version}/projects/{project}/locations/{zone}/nodes/{name}"

    def get_node(self, project: str, zone: str, name: str) -> dict[str, Any]:
        path = self.node_path(project, zone, name)
        what = f"looking up TPU node {name!r}"
        try:
            if self._client is not None:
                nodes = self._client.projects().locations().nodes()
                return execute(nodes.get(name=path.split("/", 1)[1]), what)
            return self.api.call("GET", path, what=what, permission="tpu.nodes.get")
        except Exception as exc:
            # TF raises ValueError for any failed lookup; keep the type and TF's words (code
            # and TF's own test match them), say more.
            where = "the service= client" if self._client is not None else self.api.base_url
            raise ValueError(
                f"Could not lookup TPU metadata: TPU node {name!r} in project {project!r}, "
                f"zone {zone!r} "
                f"(Cloud TPU API {self.api_version} at {where}): {exc}"
            ) from exc


def _port(value: object, name: str) -> int:
    if value is None or value == "":
        return DEFAULT_TPU_PORT
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise RuntimeError(f"TPU node {name!r} reports port {value!r}; expected a port number")


def node_endpoints(node: dict[str, Any], name: str) -> list[tuple[str, int]]:
    """``[(ip, port), ...]`` of a ``READY`` node, from ``networkEndpoints`` or the legacy
    top-level ``ipAddress``/``port``; ``RuntimeError`` for a node in any other state."""
    state = node.get("state")
    if state != "READY":
        advice = _NOT_READY_ADVICE.get(str(state), "Wait until it is READY.")
        raise RuntimeError(
            f"TPU node {name!r} is not ready: its state is {state!r} (health "
            f"{node.get('health', 'unknown')!r}); expected 'READY'. {advice}"
        )
    raw = node.get("networkEndpoints")
    if isinstance(raw, list) and raw:
        endpoints = []
        for i, endpoint in enumerate(raw):
            ip = endpoint.get("ipAddress") if isinstance(endpoint, dict) else None
            if not isinstance(ip, str) or not ip:
                raise RuntimeError(
                    f"TPU node {name!r} networkEndpoints[{i}] has no ipAddress: {endpoint!r}"
                )
            endpoints.append((ip, _port(endpoint.get("port"), name)))
        return endpoints
    ip = node.get("ipAddress")
    if isinstance(ip, str) and ip:
        return [(ip, _port(node.get("port"), name))]
    raise RuntimeError(
        f"TPU node {name!r} is READY but lists no network endpoints (neither networkEndpoints "
        "nor ipAddress); expected at least one worker address"
    )


def node_topology(node: dict[str, Any]) -> str | None:
    """``acceleratorConfig.topology`` (e.g. ``'2x2x2'``) when the API reports it."""
    config = node.get("acceleratorConfig")
    topology = config.get("topology") if isinstance(config, dict) else None
    return topology if isinstance(topology, str) and topology else None
