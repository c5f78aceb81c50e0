"""Elastic workers: which workers a coordinator has, adding and removing them while closures
run, and re-resolving the cluster on a period (``refresh_interval``).

Worker indices are positions in the order workers joined: the first ones are the
resolver's ``worker`` tasks 0..n-1 (TF's indices), each added worker takes the next index,
and an index is never reused. A removed worker keeps its index with the state
``"removed"``; a worker that returns under the same address after being removed is a new
worker with a new index. So ``get_current_worker_index()`` on a worker, and the elements of
``PerWorkerValues`` (one per index), always refer to the same worker process slot.

On a sliced coordinator (``hosts_per_slice=K``) a worker index is a slice: the dispatcher
knows its rank-0 host, and this table knows all of its hosts. Slices join and leave whole:
``add_workers`` takes whole slices, naming any host of a slice in ``remove_workers``
removes that slice, and a refresh compares whole slices (a slice whose hosts changed is
removed, and the new grouping added).

Example::

    coordinator = ClusterCoordinator(resolver, refresh_interval=30.0)  # follows the resolver
    coordinator.add_workers(["10.0.0.7:8470"])      # -> [4]: the new worker's index
    coordinator.remove_workers(["10.0.0.3:8470"])   # drains it, then returns
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from jaxcluster._auth import warn_if_token_in_clear

__all__ = ["Membership", "Refresher"]

_log = logging.getLogger("jaxcluster.coordinator")

#: Probes of given-up workers in flight at once during a refresh (each a thread waiting on
#: a ``GetStatus`` without the GIL).
_MAX_PROBES = 32


class Membership:
    """Changes to the workers of one dispatcher (checked, logged, probed), and its views.

    The dispatcher is the one owner of the worker table (addresses by index, removed,
    given up): this class asks it. It keeps only what the dispatcher does not know: the
    other hosts of each index's slice (``slices``, by index, rank 0 first; one host each
    on an unsliced coordinator). One lock orders every change, so a refresh and a user's
    call never interleave.

    ``addresses`` (the workers the dispatcher started with) give one-host slices when
    ``slices`` (the hosts of each, rank 0 first) is not given.
    """

    def __init__(
        self,
        dispatcher: Any,
        addresses: Sequence[str] = (),
        token: str | None = None,
        tls_ca: bytes | None = None,
        *,
        slices: Sequence[Sequence[str]] | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._token, self._tls_ca = token, tls_ca
        self._lock = threading.Lock()
        groups = slices if slices is not None else [[address] for address in addresses]
        self._slices: list[tuple[str, ...]] = [tuple(group) for group in groups]

    def slices(self) -> list[list[str]]:
        """The hosts of every index's slice, rank 0 first (removed ones included)."""
        return [list(group) for group in self._slices]

    def active_slices(self) -> dict[tuple[str, ...], int]:
        """The hosts of each slice not removed → its index (one joining right now may
        be missing: its hosts are recorded just after the dispatcher takes it)."""
        known = len(self._slices)
        return {self._slices[i]: i for i in self.active().values() if i < known}

    def __len__(self) -> int:
        """How many indices there are (removed workers included)."""
        return int(self._dispatcher.num_workers)

    def address(self, index: int) -> str:
        return str(self._dispatcher.worker_addresses()[index])

    def is_removed(self, index: int) -> bool:
        return bool(self._dispatcher.is_removed(index))

    def active(self) -> dict[str, int]:
        """Address → index of every worker not removed."""
        return {str(address): int(index) for address, index in self._dispatcher.active_workers()}

    def add(self, addresses: Iterable[str]) -> list[int]:
        """Adds workers; returns their indices. See ``ClusterCoordinator.add_workers``."""
        if isinstance(addresses, str):
            addresses = [addresses]
        wanted = list(addresses)
        for address in wanted:
            if not isinstance(address, str) or ":" not in address or address.startswith(":"):
                raise ValueError(
                    f"add_workers(): {address!r} is not a worker address; expected "
                    "'host:port' strings"
                )
        if len(set(wanted)) != len(wanted):
            raise ValueError(f"add_workers(): an address appears twice in {wanted}")
        with self._lock:
            active = self.active()
            present = [address for address in wanted if address in active]
            if present:
                raise ValueError(
                    f"add_workers(): {', '.join(present)} already serve this coordinator; "
                    "a worker is added once (remove it first to add it again)"
                )
            if not wanted:
                return []
            warn_if_token_in_clear(wanted, self._token, self._tls_ca, _log, "workers", 3)
            indices = [int(i) for i in self._dispatcher.add_workers(wanted)]
            for index, address in zip(indices, wanted, strict=True):
                self._record(index, (address,))
        _log.info("added workers %s as indices %s", wanted, indices)
        return indices

    def add_slices(self, groups: Sequence[Sequence[str]]) -> list[int]:
        """Adds whole slices (each a list of hosts, rank 0 first, already checked to be
        whole); returns their indices, one per slice. Each slice is used once its rank 0
        reports being rank 0 of a slice that size, so half a slice never serves."""
        wanted = [tuple(group) for group in groups]
        hosts = [address for group in wanted for address in group]
        if len(set(hosts)) != len(hosts):
            raise ValueError(f"add_workers(): an address appears twice in {groups}")
        with self._lock:
            serving = {host for group in self.active_slices() for host in group}
            present = [address for address in hosts if address in serving]
            if present:
                raise ValueError(
                    f"add_workers(): {', '.join(present)} already serve this coordinator as "
                    "a host of one of its slices; a slice is added once (remove it first "
                    "to add it again)"
                )
            if not wanted:
                return []
            warn_if_token_in_clear(hosts, self._token, self._tls_ca, _log, "workers", 3)
            indices = self._start(wanted)
        _log.info("added slices %s as indices %s", [list(group) for group in wanted], indices)
        return indices

    def _start(self, groups: Sequence[tuple[str, ...]]) -> list[int]:
        """Starts a link per slice (under the lock), in order, and records its hosts."""
        indices: list[int] = []
        for group in groups:
            (index,) = self._dispatcher.add_workers([group[0]], slice_size=len(group))
            self._record(int(index), group)
            indices.append(int(index))
        return indices

    def _record(self, index: int, group: tuple[str, ...]) -> None:
        while len(self._slices) <= index:
            self._slices.append(())
        self._slices[index] = group

    def index_of_host(self, address: str) -> int | None:
        """The index of the slice (not removed) that ``address`` is a host of."""
        for group, index in self.active_slices().items():
            if address in group:
                return index
        return None

    def remove(self, which: Iterable[str | int] | str | int) -> list[int]:
        """Removes workers by address or index; returns their indices once they have
        left. See ``ClusterCoordinator.remove_workers``."""
        if isinstance(which, (str, int)):
            which = [which]
        with self._lock:
            active = self.active()
            indices: list[int] = []
            for item in which:
                if isinstance(item, bool) or not isinstance(item, (str, int)):
                    raise TypeError(
                        f"remove_workers(): {item!r}; expected worker addresses ('host:port') "
                        "or worker indices"
                    )
                if isinstance(item, str):
                    found = self.index_of_host(item)
                    if found is None:
                        raise ValueError(
                            f"remove_workers(): no worker of this coordinator is at {item!r}; "
                            f"its workers are {sorted(self._hosts_of(active.values()))}"
                        )
                    index = found
                elif not 0 <= item < len(self):
                    raise ValueError(
                        f"remove_workers(): there is no worker {item}; the indices are 0 to "
                        f"{len(self) - 1}"
                    )
                elif self.is_removed(item):
                    raise ValueError(
                        f"remove_workers(): worker {item} ({self.address(item)}) was "
                        "already removed"
                    )
                else:
                    index = item
                if index not in indices:
                    indices.append(index)
            if not indices:
                return []
            # Blocks (without the GIL, interruptibly) until each has drained and left.
            self._dispatcher.remove_workers(indices)
        _log.info("removed workers %s (%s)", indices, ", ".join(self._hosts_of(indices)))
        return indices

    def _hosts_of(self, indices: Iterable[int]) -> list[str]:
        """Every host of the slices at ``indices`` (a slice leaves as a unit)."""
        return [host for index in indices for host in self._slices[index]]

    def given_up(self) -> list[str]:
        """Addresses of the workers (not removed) whose link gave up reconnecting."""
        return [str(address) for address in self._dispatcher.given_up_workers()]

    def answers(self, address: str, timeout: float = 5.0) -> bool:
        """Whether a worker serves at ``address`` now (a ``GetStatus`` with this
        coordinator's token and TLS settings)."""
        from jaxcluster import errors
        from jaxcluster._native import core

        try:
            client = core.WorkerClient(
                address,
                auth_token=self._token,
                timeout=timeout,
                connect_timeout=timeout,
                tls_ca=self._tls_ca,
            )
            return client.get_status(timeout=timeout).state == core.ServingState.SERVING
        except (errors.JaxClusterError, ValueError, OSError):
            return False

    def answering(self, addresses: Sequence[str], timeout: float = 5.0) -> list[str]:
        """Those of ``addresses`` where a worker serves now, in the order given. Probed at
        once (at most ``_MAX_PROBES`` in flight), so a refresh that finds many given-up
        workers still listed, most of them still down, waits for one probe's ``timeout``
        rather than one per address."""
        if not addresses:
            return []
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(
            max_workers=min(_MAX_PROBES, len(addresses)),
            thread_name_prefix="jaxcluster-probe",
        ) as pool:
            served = list(pool.map(lambda address: self.answers(address, timeout), addresses))
        return [address for address, up in zip(addresses, served, strict=True) if up]

    def rejoin(self, addresses: Sequence[str]) -> list[int]:
        """Gives workers that were given up a new start: each joins again as a new worker
        (the next index; its old index ends ``removed``). Added before the old ones are
        removed, so it works when every worker had been given up. Returns the new indices."""
        with self._lock:
            active = self.active()
            old = [active[address] for address in addresses if address in active]
            wanted = [address for address in addresses if address in active]
            if not wanted:
                return []
            # A slice joins again whole, with the same hosts.
            indices = self._start([self._slices[index] for index in old])
            # The address now maps to its new index, once the old one is removed.
            self._dispatcher.remove_workers(old)
        _log.info(
            "workers %s (%s), given up, join again as workers %s",
            old,
            ", ".join(wanted),
            indices,
        )
        return indices


class Refresher(threading.Thread):
    """Re-resolves the cluster every ``interval`` seconds and adds or removes workers so
    the coordinator's match the resolver's ``worker`` tasks.

    A resolver that fails (an API error, a file being rewritten) is logged as a WARNING and
    asked again next period: the workers stay as they were meanwhile. A refresh that would
    remove every worker removes none and says so. A worker given up (down past the
    recovery bound) that the resolver still lists joins again as a new worker once it
    answers: a spot VM back after hours under its old address serves again.
    """

    def __init__(
        self,
        membership: Membership,
        resolve: Callable[[], Sequence[Sequence[str]]],
        interval: float,
    ) -> None:
        super().__init__(name="jaxcluster-refresh", daemon=True)
        self._membership = membership
        self._resolve = resolve
        self._interval = interval
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self.refresh()
            except Exception as exc:  # logged, and tried again next period
                _log.warning(
                    "refreshing the cluster's workers failed (the workers stay as they are; "
                    "asking again in %.0f s): %s",
                    self._interval,
                    exc,
                )
                _log.debug("the refresh's traceback", exc_info=True)

    def refresh(self) -> None:
        """One refresh: resolve, then add what is new and remove what is gone (whole
        slices: ``resolve`` returns the workers grouped, one host per group unsliced)."""
        wanted = list(dict.fromkeys(tuple(group) for group in self._resolve()))
        active = self._membership.active_slices()
        gone = [group for group in active if group not in wanted]
        new = [group for group in wanted if group not in active]
        # A new slice that shares a host with a leaving one (its slice was regrouped) is
        # added once the old one has left.
        leaving = {host for group in gone for host in group}
        later = [group for group in new if leaving.intersection(group)]
        now = [group for group in new if group not in later]
        if now:
            self._add(now)
        if gone and len(gone) == len(active) and not now:
            _log.warning(
                "the resolver lists none of the coordinator's workers (%s); keeping them "
                "rather than removing every worker",
                ", ".join(host for group in gone for host in group),
            )
            return
        if gone:
            self._membership.remove([active[group] for group in gone])
        if later:
            self._add(later)
        listed = [group[0] for group in wanted]
        given_up = [address for address in self._membership.given_up() if address in listed]
        back = self._membership.answering(given_up)
        if back:
            self._membership.rejoin(back)

    def _add(self, groups: list[tuple[str, ...]]) -> None:
        if any(len(group) > 1 for group in groups):
            self._membership.add_slices(groups)
        else:
            self._membership.add([group[0] for group in groups])
