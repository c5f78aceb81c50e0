"""Elastic workers: which workers a coordinator has, adding and removing them while closures
run, and re-resolving the cluster on a period (``refresh_interval``).

Worker indices are positions in the order workers joined: the first ones are the
resolver's ``worker`` tasks 0..n-1 (TF's indices), each added worker takes the next index,
and an index is never reused. A removed worker keeps its index with the state
``"removed"``; a worker that returns under the same address after being removed is a new
worker with a new index. So ``get_current_worker_index()`` on a worker, and the elements of
``PerWorkerValues`` (one per index), always refer to the same worker process slot.

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
    given up): this class keeps no copy and asks it. One lock orders every change, so a
    refresh and a user's call never interleave.

    ``addresses`` (the workers the dispatcher started with) is accepted for callers that
    pass it, and not kept: the dispatcher knows them.
    """

    def __init__(
        self,
        dispatcher: Any,
        addresses: Sequence[str] = (),
        token: str | None = None,
        tls_ca: bytes | None = None,
    ) -> None:
        del addresses  # the dispatcher's table is the one copy
        self._dispatcher = dispatcher
        self._token, self._tls_ca = token, tls_ca
        self._lock = threading.Lock()

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
        _log.info("added workers %s as indices %s", wanted, indices)
        return indices

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
                    if item not in active:
                        raise ValueError(
                            f"remove_workers(): no worker of this coordinator is at {item!r}; "
                            f"its workers are {sorted(active)}"
                        )
                    index = active[item]
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
        _log.info("removed workers %s (%s)", indices, ", ".join(map(self.address, indices)))
        return indices

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
            indices = [int(i) for i in self._dispatcher.add_workers(wanted)]
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
        resolve: Callable[[], list[str]],
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
        """One refresh: resolve, then add what is new and remove what is gone."""
        wanted = list(dict.fromkeys(self._resolve()))
        active = self._membership.active()
        gone = [address for address in active if address not in wanted]
        new = [address for address in wanted if address not in active]
        if new:
            self._membership.add(new)
        if gone and len(gone) == len(active) and not new:
            _log.warning(
                "the resolver lists none of the coordinator's workers (%s); keeping them "
                "rather than removing every worker",
                ", ".join(gone),
            )
            return
        if gone:
            self._membership.remove(gone)
        listed = [address for address in self._membership.given_up() if address in wanted]
        back = self._membership.answering(listed)
        if back:
            self._membership.rejoin(back)
