"""GCEClusterResolver: the tasks of a job are the running instances of a GCE instance group.

TF 2.21 semantics (``tf.distribute.cluster_resolver.GCEClusterResolver``): list the group's
instances (every page), keep the ``RUNNING`` ones, read each one's first network interface IP,
and sort the ``ip:port`` addresses as strings. Deliberate changes: the Compute Engine REST API is
called directly through google-auth with timeouts and retries (unless ``service=`` is TF's
discovery client, which is then called as TF does), an empty group is an empty job rather
than a ``KeyError``, and errors say what to fix.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jaxcluster.cluster_resolver._discovery import execute, is_discovery_client
from jaxcluster.cluster_resolver._google import (
    DEFAULT_API_TIMEOUT,
    GoogleAPI,
    check_base_url,
    positive_timeout,
)
from jaxcluster.cluster_resolver.base import ClusterResolver, format_master_url
from jaxcluster.cluster_spec import ClusterSpec

__all__ = ["DEFAULT_COMPUTE_API", "GCEClusterResolver"]

#: Root of the Compute Engine API; ``compute/v1/...`` paths are appended to it.
DEFAULT_COMPUTE_API = "https://compute.googleapis.com/"
_PAGE_SIZE = 500
# Instance lookups are independent; a few in flight hides the round trips of a large group
# without tripping per-user rate limits.
_PARALLEL_LOOKUPS = 8


def _name(value: object, what: str) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if not isinstance(value, str) or not value.strip() or "/" in value:
        raise ValueError(f"{what} must be a non-empty name without '/'; got {value!r}")
    return value.strip()


class GCEClusterResolver(ClusterResolver):
    """Cluster spec from the running instances of a Compute Engine instance group.

    Example::

        resolver = GCEClusterResolver("my-project", "us-east1-b", "trainers", port=8470)
        resolver.cluster_spec().as_dict()   # {'worker': ['10.0.0.2:8470', '10.0.0.3:8470']}
        resolver.task_id = 1
        resolver.master()                   # 'grpc://10.0.0.3:8470'

    ``credentials``: ``'default'`` (or ``None``) for Application Default Credentials, or any
    ``google.auth.credentials.Credentials`` (``AnonymousCredentials()`` for a local test
    server). ``service``: a googleapiclient discovery client for Compute Engine (as TF:
    ``discovery.build("compute", "v1")``; its ``instanceGroups().listInstances(...)`` and
    ``instances().get(...)`` are called and ``execute()``-d, ``credentials`` unused), or a
    ``requests.Session`` (e.g. an ``AuthorizedSession`` with your own adapters or proxies) to
    make the REST calls with; anything else is a ``TypeError``. Keyword-only: ``api_endpoint`` (root
    URL of the Compute API, default ``https://compute.googleapis.com/``) and ``timeout``
    (seconds per request, default 30).
    """

    def __init__(
        self,
        project: str,
        zone: str,
        instance_group: str,
        port: int,
        task_type: str = "worker",
        task_id: int = 0,
        rpc_layer: str | None = "grpc",
        credentials: Any = "default",
        service: Any = None,
        *,
        api_endpoint: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self._project = _name(project, "project")
        self._zone = _name(zone, "zone")
        self._instance_group = _name(instance_group, "instance_group")
        if isinstance(port, bool) or not isinstance(port, (int, str)) or not str(port).isdigit():
            raise ValueError(f"port must be a port number such as 8470; got {port!r}")
        if not 0 < int(port) < 65536:
            raise ValueError(f"port must be from 1 to 65535; got {port!r}")
        self._port = int(port)
        root = DEFAULT_COMPUTE_API
        if api_endpoint is not None:
            # Accept the API root or, as googleapiclient users write it, the versioned base.
            root = check_base_url(api_endpoint, "api_endpoint").removesuffix("compute/v1/")
        # TF's discovery client, called as TF calls it; else the REST API (service= a Session).
        self._client = (
            service if is_discovery_client(service, "instanceGroups", "instances") else None
        )
        self._api = GoogleAPI(
            "Compute Engine API",
            root,
            credentials=credentials,
            service=None if self._client is not None else service,
            timeout=DEFAULT_API_TIMEOUT if timeout is None else positive_timeout(timeout),
        )
        if task_type is not None and not isinstance(task_type, str):
            raise TypeError(f"task_type must be a string; got {task_type!r}")
        # Kept as given, '' and None included (TF does the same). None names no task, so
        # master() is '' unless asked for one; the group's job is then still "worker".
        self._task_type = task_type
        self._job = "worker" if task_type is None else task_type
        self.task_id = task_id
        self.rpc_layer = rpc_layer

    @property
    def task_type(self) -> str | None:
        """The name of the job the instance group forms (``None``: no task of it is this
        process's; the job is then ``worker``); fixed when the resolver is made."""
        return self._task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        # As TF: the job name is part of what this resolver resolves (a UnionClusterResolver
        # merges by it), so changing it afterwards would silently move the group's tasks.
        # TF's sentence first: code (and TF's own test) matches it.
        raise RuntimeError(
            "You cannot reset the task_type of the GCEClusterResolver after it has been "
            f"created. It is the name of the instance group's job ({self._job!r}) and cannot "
            f"be changed (tried {task_type!r}); make a new "
            f"GCEClusterResolver(..., task_type={task_type!r})"
        )

    @property
    def _zone_path(self) -> str:
        return f"compute/v1/projects/{self._project}/zones/{self._zone}"

    def _group_desc(self) -> str:
        return (
            f"instance group {self._instance_group!r} in project {self._project!r}, "
            f"zone {self._zone!r}"
        )

    def _list_page(self, token: str | None) -> dict[str, Any]:
        """One page of the group's RUNNING instances (the first when ``token`` is ``None``)."""
        what = f"listing the instances of {self._group_desc()}"
        paging: dict[str, Any] = {"maxResults": _PAGE_SIZE}
        if token is not None:
            paging["pageToken"] = token
        if self._client is not None:
            request = self._client.instanceGroups().listInstances(
                project=self._project,
                zone=self._zone,
                instanceGroup=self._instance_group,
                body={"instanceState": "RUNNING"},
                **paging,
            )
            return execute(request, what)
        return self._api.call(
            "POST",
            f"{self._zone_path}/instanceGroups/{self._instance_group}/listInstances",
            params=paging,
            body={"instanceState": "RUNNING"},
            what=what,
            permission="compute.instanceGroups.list",
        )

    def _get_instance(self, name: str) -> dict[str, Any]:
        what = f"reading instance {name!r} of {self._group_desc()}"
        if self._client is not None:
            request = self._client.instances().get(
                project=self._project, zone=self._zone, instance=name
            )
            return execute(request, what)
        return self._api.call(
            "GET",
            f"{self._zone_path}/instances/{name}",
            what=what,
            permission="compute.instances.get",
        )

    def _running_instances(self) -> list[str]:
        """Names of the group's RUNNING instances, over every page."""
        names: list[str] = []
        token: str | None = None
        seen_tokens: set[str] = set()
        while True:
            page = self._list_page(token)
            for item in page.get("items") or []:
                # The request asks for RUNNING only; check a status the answer gives anyway.
                if not isinstance(item, dict) or item.get("status", "RUNNING") != "RUNNING":
                    continue
                url = item.get("instance")
                if isinstance(url, str) and url.rstrip("/"):
                    names.append(url.rstrip("/").rsplit("/", 1)[-1])
            token = page.get("nextPageToken")
            if not token:
                return names
            if token in seen_tokens:
                raise RuntimeError(
                    f"the Compute Engine API returned page token {token!r} twice while "
                    f"listing {self._group_desc()}; stopping instead of looping forever"
                )
            seen_tokens.add(token)

    def _instance_ip(self, name: str) -> str:
        instance = self._get_instance(name)
        interfaces = instance.get("networkInterfaces")
        first = interfaces[0] if isinstance(interfaces, list) and interfaces else None
        ip = first.get("networkIP") if isinstance(first, dict) else None
        if not isinstance(ip, str) or not ip:
            raise RuntimeError(
                f"instance {name!r} of {self._group_desc()} has no internal IP on its first "
                f"network interface (networkInterfaces: {interfaces!r}); expected networkIP"
            )
        return ip

    def cluster_spec(self) -> ClusterSpec:
        """``{task_type: sorted ip:port of every RUNNING instance}``, listed now.

        An empty group gives ``{task_type: []}``. Raises ``GoogleAPIError`` (a
        ``RuntimeError``) for API errors, naming the permission for a 403.
        """
        names = self._running_instances()
        # A discovery client's httplib2 transport is not thread-safe: one lookup at a time.
        if len(names) > 1 and self._client is None:
            with ThreadPoolExecutor(min(_PARALLEL_LOOKUPS, len(names))) as pool:
                ips = list(pool.map(self._instance_ip, names))
        else:
            ips = [self._instance_ip(n) for n in names]
        workers = sorted(f"{ip}:{self._port}" for ip in ips)
        return ClusterSpec({self._job: workers})

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """``grpc://ip:port`` of a task (by default this resolver's ``task_type``/``task_id``);
        ``''`` when neither the call nor the resolver names a task type (as TF).

        ``ValueError`` naming the instance group when it has no such task (e.g. it is empty).
        """
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            return ""
        spec = self.cluster_spec()
        group = self._group_desc()
        if task_type not in spec.jobs:
            raise ValueError(
                f"task type {task_type!r} is not a job of this resolver; its only job is "
                f"{spec.jobs[0]!r}, the RUNNING instances of {group}"
            )
        count = spec.num_tasks(task_type)
        if count == 0:
            raise ValueError(
                f"{group} has no RUNNING instances, so job {task_type!r} has no task "
                f"{task_id}; start instances in the group (or wait for them to boot)"
            )
        if not 0 <= int(task_id) < count:
            raise ValueError(
                f"task_id {task_id} is out of range: {group} has {count} RUNNING "
                f"instance(s), task ids 0..{count - 1}"
            )
        address = spec.task_address(task_type, int(task_id))
        return format_master_url(address, rpc_layer or self.rpc_layer)
