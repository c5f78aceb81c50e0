"""Clients shaped as ``googleapiclient.discovery.build(...)`` returns them, for the resolvers'
``service=`` (TF's argument): collections are methods, each method takes keyword arguments
only and returns a request whose ``execute()`` answers the API's JSON. They answer from
plain data and record every call, so a test asserts what the resolver made of the answers
and which calls it made, with no network and no googleapiclient."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Calls", "ComputeClient", "TpuClient"]

#: Every call a client took: (method, keyword arguments).
Calls = list[tuple[str, dict[str, Any]]]


class _Request:
    def __init__(self, answer: Callable[[], dict[str, Any]]) -> None:
        self._answer = answer

    def execute(self) -> dict[str, Any]:
        return self._answer()


class _Collection:
    def __init__(self, calls: Calls, **methods: Callable[..., dict[str, Any]]) -> None:
        self._calls, self._methods = calls, methods

    def __getattr__(self, name: str) -> Callable[..., _Request]:
        method = self._methods[name]

        def call(**kwargs: Any) -> _Request:
            self._calls.append((name, kwargs))
            return _Request(lambda: method(**kwargs))

        return call


class ComputeClient:
    """``discovery.build("compute", "v1")`` for one zone: ``instances`` (kept as ``vms``)
    maps instance name to (internal IP, status); ``listInstances`` answers ``page_size``
    instances a page, in name order, with ``nextPageToken`` while more remain."""

    def __init__(self, instances: dict[str, tuple[str, str]], page_size: int = 500) -> None:
        self.vms = instances
        self.page_size = page_size
        self.calls: Calls = []

    def instanceGroups(self) -> _Collection:
        return _Collection(self.calls, listInstances=self._list_instances)

    def instances(self) -> _Collection:
        return _Collection(self.calls, get=self._get)

    def _list_instances(
        self,
        *,
        project: str,
        zone: str,
        instanceGroup: str,
        body: dict[str, Any],
        maxResults: int = 500,
        pageToken: str | None = None,
    ) -> dict[str, Any]:
        del instanceGroup, maxResults
        wanted = body.get("instanceState", "ALL")
        names = [n for n, (_, s) in sorted(self.vms.items()) if wanted in ("ALL", s)]
        start = int(pageToken or 0)
        page = names[start : start + self.page_size]
        answer: dict[str, Any] = {
            "items": [
                {
                    "instance": f"https://www.googleapis.com/compute/v1/projects/{project}/"
                    f"zones/{zone}/instances/{name}",
                    "status": self.vms[name][1],
                }
                for name in page
            ]
        }
        if start + self.page_size < len(names):
            answer["nextPageToken"] = str(start + self.page_size)
        return answer

    def _get(self, *, project: str, zone: str, instance: str) -> dict[str, Any]:
        del project, zone
        return {"name": instance, "networkInterfaces": [{"networkIP": self.vms[instance][0]}]}


class TpuClient:
    """``discovery.build("tpu", "v2")``: ``nodes`` maps a node's full name
    (``projects/P/locations/Z/nodes/N``) to its JSON."""

    def __init__(self, nodes: dict[str, dict[str, Any]]) -> None:
        self.nodes = nodes
        self.calls: Calls = []

    def projects(self) -> _Chain:
        nodes = _Collection(self.calls, get=self._get)
        return _Chain(locations=_Chain(nodes=nodes))

    def _get(self, *, name: str) -> dict[str, Any]:
        return self.nodes[name]


class _Chain:
    """A collection whose methods return further collections (``projects().locations()``)."""

    def __init__(self, **children: Any) -> None:
        self._children = children

    def __getattr__(self, name: str) -> Callable[[], Any]:
        child = self._children[name]
        return lambda: child
