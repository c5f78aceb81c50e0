"""A worker host that is one of the K hosts of a slice: one ``jax.distributed`` group that
runs every closure SPMD.

The coordinator talks to each slice's rank-0 host only; that host forwards every job
(closures, resource creation and release) to its peers and runs it itself at the same
time, so all K hosts enter the program together and its collectives span the slice. How
the hosts of a slice start (``join``), find each other (``exchange``, through the key-value
store of their ``jax.distributed`` coordination service) and stop together (``SliceWatch``)
lives here; the forwarding is :mod:`jaxcluster.worker.fanout`.

A slice fails as a unit. ``jax.distributed`` cannot be re-initialised in a process, so a
host that sees its slice broken (a peer silent past ``heartbeat_timeout``, a peer or its
leader restarted) exits with :data:`SLICE_BROKEN_EXIT`; its supervisor
(:mod:`jaxcluster.worker.supervisor`) starts it again and the slice forms anew.

Example::

    config = SliceConfig(index=0, rank=1, size=2, coordinator="10.0.0.5:8476")
    join(config)                     # jax.distributed.initialize among the slice's hosts
    hosts = exchange(config, me)     # every host's SliceHost, checked to agree
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from jaxcluster import errors

__all__ = [
    "SLICE_BROKEN_EXIT",
    "SliceConfig",
    "SliceHost",
    "SliceMismatchError",
    "SliceWatch",
    "exchange",
    "gather_output",
    "join",
]

_log = logging.getLogger("jaxcluster.worker.slice")

#: Exit status of a host whose slice broke (EX_TEMPFAIL): its supervisor starts it again.
SLICE_BROKEN_EXIT = 75
_KEY = "jaxcluster/slice/host/{rank}"


class SliceMismatchError(RuntimeError):
    """The hosts that joined one ``jax.distributed`` group disagree about the slice they
    form; the message names every host and what it said."""


@dataclass(frozen=True)
class SliceConfig:
    """This host's place in its slice: slice ``index``, ``rank`` among its ``size`` hosts,
    and the slice's ``jax.distributed`` coordinator ``HOST:PORT`` (served by rank 0)."""

    index: int
    rank: int
    size: int
    coordinator: str
    init_timeout: float = 300.0
    heartbeat_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"slice size {self.size}; expected at least 1 host")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"slice rank {self.rank}; expected 0..{self.size - 1}")
        if self.index < 0:
            raise ValueError(f"slice index {self.index}; expected 0 or more")
        host, sep, port = self.coordinator.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"slice coordinator {self.coordinator!r}; expected HOST:PORT")
        if self.heartbeat_timeout <= 0 or self.init_timeout <= 0:
            raise ValueError("slice heartbeat and init timeouts must be positive")

    @property
    def leader(self) -> bool:
        """Whether this host is rank 0: the one the coordinator talks to."""
        return self.rank == 0


@dataclass(frozen=True)
class SliceHost:
    """What one host of a slice tells the others: where its worker server listens, which
    incarnation of it runs, and the slice it believes it is part of."""

    rank: int
    index: int
    size: int
    address: str
    incarnation: int
    hostname: str
    pid: int

    def describe(self) -> str:
        return (
            f"rank {self.rank} at {self.address} ({self.hostname}, pid {self.pid}) says "
            f"slice {self.index} of {self.size} hosts"
        )


def _bind_address(coordinator: str) -> str | None:
    # JAX's coordination service listens on every interface by default; a slice whose
    # coordinator is a loopback (or any literal) IP listens there only.
    host, _, port = coordinator.rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    return f"{host}:{port}"


def join(config: SliceConfig) -> None:
    """``jax.distributed.initialize`` among the slice's hosts (CPU collectives through
    gloo, so a slice of CPU hosts runs cross-host collectives too). Raises
    :class:`errors.DeadlineExceededError` naming the coordinator when the slice does not
    form within ``config.init_timeout`` seconds."""
    import jax

    # Cross-process collectives on CPU (forced host devices in tests, CPU-only hosts);
    # accelerators use their own and ignore this.
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, ValueError) as exc:  # pragma: no cover - older/newer JAX
        _log.warning("cannot select gloo CPU collectives: %s", exc)
    kwargs: dict[str, Any] = {
        "coordinator_address": config.coordinator,
        "num_processes": config.size,
        "process_id": config.rank,
        "initialization_timeout": max(1, int(config.init_timeout)),
    }
    bind = _bind_address(config.coordinator) if config.leader else None
    if bind is not None:
        kwargs["coordinator_bind_address"] = bind
    _log.info(
        "slice %d: joining as rank %d of %d through %s",
        config.index,
        config.rank,
        config.size,
        config.coordinator,
    )
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as exc:
        raise errors.DeadlineExceededError(
            f"slice {config.index}: rank {config.rank} of {config.size} could not form the "
            f"slice through {config.coordinator} within {config.init_timeout:g} s "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def _client() -> Any:
    from jax._src import distributed  # the key-value store has no public accessor

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialized; join the slice first")
    return client


def exchange(config: SliceConfig, address: str, incarnation: int) -> list[SliceHost]:
    """Publishes this host's :class:`SliceHost` and reads every host's, by rank. Raises
    :class:`SliceMismatchError` naming every host when they disagree about the slice
    (index or size) or ``jax.process_count()`` is not the slice size."""
    import jax

    me = SliceHost(
        rank=config.rank,
        index=config.index,
        size=config.size,
        address=address,
        incarnation=incarnation,
        hostname=socket.gethostname(),
        pid=os.getpid(),
    )
    client = _client()
    client.key_value_set(_KEY.format(rank=config.rank), json.dumps(asdict(me)))
    timeout_ms = max(1000, int(config.init_timeout * 1000))
    hosts = [me]
    count = min(config.size, jax.process_count())
    for rank in range(count):
        if rank != config.rank:
            raw = client.blocking_key_value_get(_KEY.format(rank=rank), timeout_ms)
            hosts.append(SliceHost(**json.loads(raw)))
    hosts.sort(key=lambda host: host.rank)
    disagree = [h for h in hosts if (h.index, h.size) != (config.index, config.size)]
    if disagree or jax.process_count() != config.size:
        said = "; ".join(h.describe() for h in hosts)
        raise SliceMismatchError(
            f"the hosts of slice {config.index} disagree: {said}; jax.process_count() is "
            f"{jax.process_count()}. Start every host of a slice with the same --slice-index "
            "and --slice-size and a distinct --slice-rank"
        )
    return hosts


class SliceWatch:
    """Asks ``hosts`` (their worker servers, which answer even while a closure holds the
    interpreter) for their status every ``timeout / 4`` seconds; a host that does not
    answer within ``timeout`` or answers with another incarnation has failed, and
    ``on_broken(reason)`` runs once (by default: log and exit with
    :data:`SLICE_BROKEN_EXIT`). A host that answers with a preemption notice makes
    ``on_notice(host, status)`` run once for it: rank 0 takes a peer's notice as the
    slice's, since a slice is preempted as a unit.

    Example::

        SliceWatch([leader], token, timeout=10.0).start()   # a peer watches rank 0
    """

    def __init__(
        self,
        hosts: Sequence[SliceHost],
        auth_token: str | None,
        timeout: float,
        *,
        slice_index: int = 0,
        on_broken: Callable[[str], None] | None = None,
        on_notice: Callable[[SliceHost, Any], None] | None = None,
        tls_ca: bytes | None = None,
    ) -> None:
        from jaxcluster._native import core

        self._hosts = list(hosts)
        self._timeout = timeout
        self._index = slice_index
        self._clients = [
            core.WorkerClient(
                h.address, auth_token, timeout, connect_timeout=timeout, tls_ca=tls_ca
            )
            for h in self._hosts
        ]
        self._on_broken = on_broken or broken
        self._on_notice = on_notice
        self._noticed: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="jaxcluster-slice-watch", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def check(self) -> str | None:
        """One round: why the slice is broken, or ``None`` when every host answered."""
        for host, client in zip(self._hosts, self._clients, strict=True):
            try:
                status = client.get_status(timeout=self._timeout)
            except errors.JaxClusterError as exc:
                return (
                    f"slice {self._index}: rank {host.rank} at {host.address} did not answer "
                    f"within {self._timeout:g} s ({type(exc).__name__}: {exc})"
                )
            if status.incarnation != host.incarnation:
                return (
                    f"slice {self._index}: rank {host.rank} at {host.address} restarted "
                    f"(incarnation {host.incarnation:#x} is now {status.incarnation:#x})"
                )
            if (
                self._on_notice is not None
                and status.preemption_source is not None
                and host.rank not in self._noticed
            ):
                self._noticed.add(host.rank)
                self._on_notice(host, status)
        return None

    def _run(self) -> None:
        while not self._stop.wait(self._timeout / 4):
            reason = self.check()
            if reason is not None and not self._stop.is_set():
                self._on_broken(reason)
                return


def broken(reason: str) -> None:
    """Ends this host's process because its slice broke; the supervisor restarts it."""
    _log.error("%s; this host restarts so the slice can form again", reason)
    for handler in logging.getLogger().handlers + logging.getLogger("jaxcluster").handlers:
        with contextlib.suppress(Exception):  # exiting regardless
            handler.flush()
    os._exit(SLICE_BROKEN_EXIT)


def gather_output(value: Any) -> Any:
    """``value`` with every ``jax.Array`` that spans more than this host made local, on
    every host of the slice in the same order (a collective for sharded arrays): a fully
    replicated array becomes this host's copy, a sharded one the gathered global array
    (``multihost_utils.process_allgather``). Everything else is returned as is."""
    import jax

    def local(leaf: Any) -> Any:
        if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
            return leaf
        if leaf.is_fully_replicated:
            return leaf.addressable_data(0)
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(leaf, tiled=True)

    return jax.tree_util.tree_map(local, value)
