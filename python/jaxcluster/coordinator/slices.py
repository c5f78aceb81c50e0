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

Slices that join later (``add_workers``, a refresh) are grouped the same way:
:func:`slices_to_add` takes a flat list of whole slices, or a list of slices.

Example::

    group_slices(["h:1", "h:2", "h:3", "h:4"], hosts_per_slice=2)
    # [['h:1', 'h:2'], ['h:3', 'h:4']]
    slices_to_add(["h:5", "h:6"], hosts_per_slice=2)      # [['h:5', 'h:6']]
    slices_to_add([["h:5", "h:6"]], hosts_per_slice=2)    # the same
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jaxcluster.coordinator._options import _worker_addresses

__all__ = [
    "group_slices",
    "initial_slices",
    "slices_argument",
    "slices_resolver",
    "slices_to_add",
]


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


def slices_to_add(addresses: Any, hosts_per_slice: int | None) -> list[list[str]]:
    """``add_workers``' argument on a sliced coordinator, as whole slices.

    Either a flat list of ``host:port`` strings, a multiple of ``hosts_per_slice`` whose
    consecutive runs form the slices (rank 0 first: the grouping ``hosts_per_slice``
    gives a resolver's worker tasks), or a list of slices, each a list of addresses with
    rank 0 first (as ``slices=`` takes). ``hosts_per_slice`` ``None``: the coordinator's
    slices differ in size, so only the list of slices is accepted. A partial slice is a
    ``ValueError`` saying what was expected: half a slice never serves.
    """
    if isinstance(addresses, str):
        addresses = [addresses]
    items = list(addresses)
    if not items:
        return []
    if all(isinstance(item, str) for item in items):
        k = hosts_per_slice
        if k is None:
            raise ValueError(
                "add_workers(): this coordinator's slices differ in size, so a flat list of "
                "addresses cannot say which hosts form a slice; give a list of slices, "
                "each a list of 'host:port' addresses with its rank-0 host first"
            )
        if len(items) % k:
            left = items[len(items) - len(items) % k :]
            raise ValueError(
                f"add_workers(): {len(items)} addresses are not whole slices of "
                f"hosts_per_slice={k} hosts ({', '.join(left)} would be part of a slice); "
                f"expected a multiple of {k} addresses, each {k} in a row one slice with "
                "its rank-0 host first, or a list of slices"
            )
        groups: list[Any] = [items[i : i + k] for i in range(0, len(items), k)]
    else:
        groups = items
    try:
        checked = slices_argument(groups)
    except ValueError as exc:
        raise ValueError(f"add_workers(): {exc}") from None
    if hosts_per_slice is not None:
        for group in checked:
            if len(group) != hosts_per_slice:
                raise ValueError(
                    f"add_workers(): the slice {group} has {len(group)} hosts, but this "
                    f"coordinator's slices have hosts_per_slice={hosts_per_slice}; a slice "
                    "joins only with all of its hosts"
                )
    return checked


def initial_slices(
    resolver: Any, slices: Any, hosts_per_slice: int | None
) -> tuple[list[list[str]], Callable[[], list[list[str]]]]:
    """A coordinator's first slices (one host each when unsliced) and how a refresh finds
    them again: from ``slices=`` given outright, or by grouping the resolver's workers."""
    if slices is not None:
        first = slices_argument(slices)
        if hosts_per_slice is not None and any(len(g) != hosts_per_slice for g in first):
            raise ValueError(
                f"slices= has slices of {sorted({len(g) for g in first})} hosts "
                f"but hosts_per_slice={hosts_per_slice}"
            )
        return first, lambda: first  # given outright: what a refresh finds too

    def regroup() -> list[list[str]]:
        return group_slices(_worker_addresses(resolver), hosts_per_slice, resolver=resolver)

    return regroup(), regroup
