"""Grouping a cluster's worker tasks into slices: the unit a sliced coordinator schedules
onto.

A slice is K hosts that form one ``jax.distributed`` group (``jaxcluster worker
--slice-size K``); the coordinator sends each closure to the slice's rank-0 host, which
runs it SPMD on all K. Where the grouping comes from, first match wins:

1. ``slices=[[addr, ...], ...]`` given explicitly (rank 0 first in each);
2. ``hosts_per_slice=K``: worker tasks ``i*K .. i*K+K-1`` are slice ``i``;
3. a resolver that knows its slices (``resolver.slices()``, e.g. the hosts of one TPU
   node);
4. otherwise every worker is its own slice of one host (the plain coordinator).

Example::

    group_slices(["h:1", "h:2", "h:3", "h:4"], hosts_per_slice=2)
    # [['h:1', 'h:2'], ['h:3', 'h:4']]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["group_slices", "slices_argument", "slices_resolver"]


def slices_argument(slices: Any) -> list[list[str]]:
    """``slices=`` checked: a non-empty list of non-empty lists of ``host:port`` strings,
    no address twice."""
    if isinstance(slices, (str, bytes)) or not isinstance(slices, Sequence) or not slices:
        raise ValueError(
            f"slices={slices!r}; expected a non-empty list of slices, each a list of "
            "'host:port' addresses with its rank-0 host first"
        )
    out: list[list[str]] = []
    seen: set[str] = set()
    for i, group in enumerate(slices):
        if isinstance(group, (str, bytes)) or not isinstance(group, Sequence) or not group:
            raise ValueError(
                f"slices[{i}]={group!r}; expected a non-empty list of 'host:port' addresses"
            )
        for address in group:
            if not isinstance(address, str) or ":" not in address:
                raise ValueError(f"slices[{i}] holds {address!r}; expected 'host:port'")
            if address in seen:
                raise ValueError(f"{address} appears in more than one place in slices=")
            seen.add(address)
        out.append(list(group))
    return out


def group_slices(
    addresses: Sequence[str],
    hosts_per_slice: int | None = None,
    *,
    resolver: Any = None,
) -> list[list[str]]:
    """The worker ``addresses`` (in task order) as slices; see the module docstring."""
    if hosts_per_slice is None:
        known = getattr(resolver, "slices", None)
        if callable(known):
            grouped = known()
            if grouped:
                return slices_argument(grouped)
        hosts_per_slice = 1
    if isinstance(hosts_per_slice, bool) or not isinstance(hosts_per_slice, int):
        raise TypeError(f"hosts_per_slice={hosts_per_slice!r}; expected an int")
    if hosts_per_slice < 1:
        raise ValueError(f"hosts_per_slice={hosts_per_slice}; expected at least 1")
    if len(addresses) % hosts_per_slice:
        raise ValueError(
            f"the cluster has {len(addresses)} worker tasks, not a multiple of "
            f"hosts_per_slice={hosts_per_slice}: the last slice would miss hosts "
            f"({', '.join(addresses[-(len(addresses) % hosts_per_slice) :])} left over)"
        )
    k = hosts_per_slice
    return [list(addresses[i : i + k]) for i in range(0, len(addresses), k)]


def slices_resolver(slices: Any) -> Any:
    """A resolver whose ``worker`` job is every host of ``slices=``, slice by slice."""
    from jaxcluster.cluster_resolver import SimpleClusterResolver
    from jaxcluster.cluster_spec import ClusterSpec

    hosts = [address for group in slices_argument(slices) for address in group]
    return SimpleClusterResolver(ClusterSpec({"worker": hosts}), rpc_layer="grpc")
