"""ClusterCoordinator: schedule closures on a cluster's workers, TF-style.

``schedule`` only serializes and enqueues; the Rust dispatcher moves closures to the
workers over gRPC (no GIL on that path), retries them when a worker fails, and settles each
closure's result cell, which :class:`RemoteValue` waits on with the GIL released.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from jaxcluster._auth import warn_if_token_in_clear
from jaxcluster._native import core
from jaxcluster.coordinator import _encoding
from jaxcluster.coordinator._errors import waiting_hint
from jaxcluster.coordinator._host import CoordinatorHost
from jaxcluster.coordinator._options import (
    _CONNECT_DEFAULT,
    _HEARTBEAT_DEFAULT,
    _RETRIES_DEFAULT,
    checked_arguments,
    checked_options,
    credentials,
    make_dispatcher,
)
from jaxcluster.coordinator.dataflow import Dataflow
from jaxcluster.coordinator.device_state import PerWorkerState
from jaxcluster.coordinator.elastic import Membership, Refresher
from jaxcluster.coordinator.functions import FunctionSerializer, function_name
from jaxcluster.coordinator.per_worker import PerWorkerDataset
from jaxcluster.coordinator.placement import WorkerFacts
from jaxcluster.coordinator.preemption_save import PreemptionSaver
from jaxcluster.coordinator.remote_value import RemoteValue
from jaxcluster.coordinator.sessions import new_session_id, shut_down
from jaxcluster.coordinator.slices import initial_slices, slices_resolver, slices_to_add
from jaxcluster.coordinator.structure import map_structure

if TYPE_CHECKING:
    from jaxcluster._core import WorkerStatus

__all__ = ["ClusterCoordinator"]

# `workers`: each up worker is asked for a fresh GetStatus, bounded by this.
_WORKERS_STATUS_TIMEOUT_SECONDS = 1.0
_log = logging.getLogger("jaxcluster.coordinator")


class ClusterCoordinator:
    """Schedules functions to run on the ``worker`` job of a cluster (TF semantics).

    Closures run at least once; a worker that fails has its closures retried elsewhere and
    is used again when it comes back. With ``error_policy="cancel_all"`` (TF's) the first
    closure error is raised by the next ``schedule``/``join``/``done`` and every queued
    closure is cancelled; with ``"per_closure"`` it stays on that closure's RemoteValue.
    A closure that fails because a parameter server is unreachable is run again while that
    ps task has fewer than ``TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`` (default 3)
    failure reports, then fails with ``PSUnavailableError`` (TF's rule).
    With ``tls_ca`` (a CA path or PEM; else the strategy's, else ``JAXCLUSTER_TLS_CA``) the
    workers are reached over TLS and verified against that CA. A worker that does not
    answer is retried with backoff for ``recovery_timeout`` seconds (default
    ``JAXCLUSTER_WORKER_RECOVERY_SEC``, else 3600), then given up. ``metrics_port`` serves
    Prometheus metrics on ``metrics_host`` (loopback unless told otherwise; needs
    ``pip install 'jaxcluster[metrics]'``). Events (workers lost, back, given up;
    closures retried) are logged to the ``jaxcluster`` loggers.

    Bounds TF does not have (see "Where jaxcluster deliberately differs" in
    docs/porting.md), each set by its argument, else by an environment variable, else by its
    default; ``None`` removes the bound:

    - ``max_closure_retries`` (``JAXCLUSTER_MAX_CLOSURE_RETRIES``, 3): a closure whose
      worker died while running it runs again at most this often, then fails with
      ``WorkerCrashedError`` naming each death; a worker lost between closures costs no
      closure anything. ``None``: retried forever, as TF does.
    - ``heartbeat_timeout`` (``JAXCLUSTER_HEARTBEAT_TIMEOUT_SEC``, 5 s): a worker running
      closures that sends nothing (not even a heartbeat, which its Rust server answers
      whatever the closure does) for this long is declared failed; its queued closures go
      to other workers and its running one is retried.
    - ``connect_timeout`` (``JAXCLUSTER_CONNECT_TIMEOUT_SEC``, 60 s): if no worker has
      answered this long after the coordinator started, ``schedule``/``join``/``fetch``
      raise ``UnavailableError`` naming every address and its last error, until one
      answers. Workers reached once and lost later keep TF's hour-long recovery bound.

    Example::

        with jaxcluster.LocalCluster(2) as cluster:
            coordinator = ClusterCoordinator(cluster.resolver, auth_token=cluster.auth_token)
            values = [coordinator.schedule(lambda x: x * x, args=(i,)) for i in range(8)]
            coordinator.join()
            coordinator.fetch(values)    # [0, 1, 4, ..., 49]
            coordinator.shutdown()
    """

    def __init__(
        self,
        cluster_resolver: Any = None,
        *,
        strategy: Any = None,
        auth_token: str | None = None,
        max_queue_size: int = 262144,
        error_policy: str = "cancel_all",
        closure_timeout: float | None = None,
        tls_ca: str | bytes | os.PathLike[str] | None = None,
        max_closure_retries: int | None = _RETRIES_DEFAULT,  # type: ignore[assignment]
        heartbeat_timeout: float | None = _HEARTBEAT_DEFAULT,  # type: ignore[assignment]
        connect_timeout: float | None = _CONNECT_DEFAULT,  # type: ignore[assignment]
        recovery_timeout: float | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        refresh_interval: float | None = None,
        hosts_per_slice: int | None = None,
        slices: Any = None,
    ) -> None:
        if cluster_resolver is None and strategy is None and slices is not None:
            cluster_resolver = slices_resolver(slices)
        if (cluster_resolver is None) == (strategy is None):
            raise TypeError(
                "ClusterCoordinator takes exactly one of cluster_resolver (positional) or "
                "strategy=; got " + ("both" if strategy is not None else "neither")
            )
        retries, heartbeat, connect = checked_options(
            max_queue_size=max_queue_size,
            error_policy=error_policy,
            closure_timeout=closure_timeout,
            max_closure_retries=max_closure_retries,
            heartbeat_timeout=heartbeat_timeout,
            connect_timeout=connect_timeout,
            recovery_timeout=recovery_timeout,
            refresh_interval=refresh_interval,
            metrics_port=metrics_port,
        )
        source = cluster_resolver if strategy is None else strategy
        resolver, token, ca = credentials(source, auth_token, tls_ca)
        self._auth_token, self._tls_ca = token, ca
        first, regroup = initial_slices(resolver, slices, hosts_per_slice)
        self._sliced = sliced = any(len(group) > 1 for group in first)
        # What add_workers groups a flat list of addresses by (None: slices differ).
        sizes = {len(group) for group in first}
        self._hosts_per_slice = hosts_per_slice or (sizes.pop() if len(sizes) == 1 else None)
        # The dispatcher sees one worker per slice: its rank-0 host, which runs each
        # closure on all of the slice's hosts.
        addresses = [group[0] for group in first]
        self._cluster_resolver = resolver
        self._strategy = None if source is resolver else source
        from jaxcluster._malloc import keep_freed_memory

        keep_freed_memory()  # large arrays: no page faults per message (see _malloc)
        warn_if_token_in_clear(addresses, token, ca, _log, "workers", stacklevel=2)
        # A logging configuration made just before this applies to the Rust events at once.
        core.refresh_log_levels()
        self._session_id = new_session_id(self._strategy)
        self._dispatcher = make_dispatcher(
            addresses,
            [len(group) for group in first],
            token,
            ca,
            self._session_id,
            max_queue_size=max_queue_size,
            error_policy=error_policy,
            closure_timeout=closure_timeout,
            retries=retries,
            heartbeat=heartbeat,
            connect=connect,
            recovery_timeout=recovery_timeout,
        )
        self._membership = Membership(self._dispatcher, addresses, token, ca, slices=first)
        self._worker_facts = WorkerFacts(self._dispatcher)
        # A jax.jit function is traced on the slice (its mesh spans hosts the coordinator
        # cannot export for), so a sliced coordinator pickles it instead.
        self._functions = FunctionSerializer(self._worker_facts.platforms, export=not sliced)
        self._closed = False
        # RemoteValues reach back through this for what the dispatcher knows (never
        # keeping the coordinator alive).
        self._ref = weakref.ref(self)
        ref = self._ref
        # What per-worker values may use of this coordinator, and no more.
        session = self._session_id
        self._saver = PreemptionSaver(
            self._dispatcher,
            self._functions,
            lambda address: core.WorkerClient(address, token, tls_ca=ca, session=session),
        )
        self._host = CoordinatorHost(
            self._dispatcher,
            self._functions,
            is_closed=lambda: (coordinator := ref()) is None or coordinator._closed,
            saver=self._saver,
        )
        # Closures that keep their result or take other closures' results.
        self._dataflow = Dataflow(
            self._dispatcher, self._host, self._functions, RemoteValue, retries
        )
        self._metrics_server: Any = None
        if metrics_port is not None:
            from jaxcluster.metrics import serve_coordinator

            try:
                self._metrics_server = serve_coordinator(
                    self._dispatcher, metrics_host, metrics_port
                )
            except BaseException:
                self._dispatcher.shutdown()
                raise
        self._refresher: Refresher | None = None
        if refresh_interval is not None:
            self._refresher = Refresher(self._membership, regroup, float(refresh_interval))
            self._refresher.start()
        _log.debug("coordinator started for %d workers: %s", len(addresses), addresses)

    # --- elastic workers -------------------------------------------------------------

    def add_workers(self, addresses: Iterable[str] | Iterable[Iterable[str]]) -> list[int]:
        """Adds workers (``"host:port"`` addresses) while closures run; returns their
        indices (the next free ones: an index is never reused).

        Returns at once; each new worker connects in the background, builds every
        per-worker dataset and device state first, then takes closures. An address that
        already serves this coordinator is refused (``ValueError``, nothing added).

        On a sliced coordinator (``hosts_per_slice=K``) it adds whole slices and returns
        one index per slice: a flat list of a multiple of K addresses (each K in a row one
        slice, rank 0 first, as ``hosts_per_slice`` groups a resolver's tasks) or a list of
        slices (``[[rank0, rank1, ...], ...]``, as ``slices=``). A partial slice is a
        ``ValueError``. A slice takes closures only once its rank 0 reports the slice
        formed with K hosts.

        Example::

            coordinator.add_workers(["10.0.0.9:8470", "10.0.0.10:8470"])  # K=2: -> [3]
        """
        self._check_open()
        if not self._sliced:
            return self._membership.add(addresses)  # type: ignore[arg-type]
        return self._membership.add_slices(slices_to_add(addresses, self._hosts_per_slice))

    def remove_workers(self, workers: Iterable[str | int] | str | int) -> None:
        """Removes workers, given by address or index, and returns once each has left.

        A removed worker takes no new closure; the ones it is running (and has queued)
        finish and their results are kept — one whose result does not arrive runs on
        another worker — and its per-worker values are released there. Nothing scheduled
        is lost. Its index stays, with state ``"removed"``, and is never reused.
        ``ValueError`` (nothing removed) for an unknown or removed worker, or when no
        worker able to run closures would remain.

        On a sliced coordinator a worker is a slice: an index, or the address of any of
        its hosts, removes the whole slice (its closures finish or run on another slice,
        and its per-slice datasets and state are released on all its hosts).
        """
        self._check_open()
        self._membership.remove(workers)

    # --- scheduling ------------------------------------------------------------------

    def schedule(
        self,
        fn: Callable[..., Any],
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        keep_result: bool = False,
    ) -> RemoteValue:
        """Enqueues ``fn(*args, **kwargs)`` for some worker; returns its RemoteValue.

        Blocks only while the queue is full. ``PerWorkerValues`` anywhere in the arguments
        become the executing worker's element. With ``error_policy="cancel_all"`` it raises
        a pending closure error (after enqueuing, so this closure is cancelled with the
        rest).

        Dataflow (where TF raises ``ValueError``): a ``RemoteValue`` anywhere in the
        tuples, lists, dicts and JAX pytree nodes of ``args``/``kwargs`` makes this
        closure wait for that producer (``schedule`` itself returns at once) and receive
        its result: a kept one is read on the worker holding it (the closure runs there
        when that worker is free) or pulled worker to worker, never through this process.
        With ``keep_result=True`` the result stays on the worker (``rv.spec``,
        ``rv.nbytes``, ``rv.worker``; ``rv.fetch()`` pulls it) and is released there when
        ``rv`` is garbage-collected. A producer's error fails its consumers with
        ``ClosureInputError`` naming it; a kept value whose worker died is made again by
        re-running its producer (lineage).

        Example::

            a = coordinator.schedule(lambda: np.ones(1 << 20), keep_result=True)
            b = coordinator.schedule(lambda x: x.sum(), args=(a,))
            b.fetch()                    # 1048576.0; the array never came back
        """
        self._check_open()
        args, kwargs = checked_arguments(args, kwargs)
        self._dataflow.tracker.take_pending_error()
        producers = self._dataflow.producers_of(args, kwargs, self)
        if producers or keep_result:
            return self._dataflow.schedule(
                fn, tuple(args), kwargs, producers, bool(keep_result), self._ref
            )
        if args or kwargs:
            encoded, resources = _encoding.encode_args(args, kwargs, self._host.resource_for)
            pickled, buffers = encoded.pickle, encoded.buffers
        else:
            pickled, buffers, resources = b"", [], []
        function = self._functions.serialize(fn, args, kwargs)
        self._worker_facts.check(function)
        self._host.register(function, fn)
        cell = self._dispatcher.schedule(function.function_hash, pickled, buffers, resources)
        return RemoteValue(cell, self._ref, function.origin, None, function_name(fn))

    def join(self, timeout: float | None = None, *, progress: bool = False) -> bool:
        """Waits until every scheduled closure has ended; ``False`` if ``timeout`` passed.

        Raises the first closure error (``cancel_all``) once nothing is running any more.
        With ``progress=True`` a ``tqdm`` bar on stderr counts the closures that end.
        """
        self._check_open()
        if progress:
            from jaxcluster.progress import join_with_progress

            self._dataflow.tracker.wait_idle(None)
            return join_with_progress(self._dispatcher, timeout)
        return self._dataflow.join(timeout)

    def done(self) -> bool:
        """Whether every scheduled closure has ended; raises a pending closure error."""
        self._check_open()
        done = bool(self._dispatcher.done())
        self._dataflow.tracker.take_pending_error()
        return done and self._dataflow.tracker.idle()

    def fetch(self, val: Any) -> Any:
        """``val`` with every RemoteValue in it replaced by its fetched result.

        Nested tuples (named too), lists and dicts keep their shape; other leaves are
        returned as they are.
        """
        return map_structure(
            lambda x: x.fetch() if isinstance(x, (RemoteValue, PerWorkerState)) else x, val
        )

    def create_per_worker_state(
        self,
        init_fn: Callable[[], Any],
        *,
        on_worker_restart: str = "rebuild",
        on_preemption: str = "rebuild",
        name: str | None = None,
    ) -> PerWorkerState:
        """State kept on every worker's devices between closures: ``init_fn()`` runs on
        each worker and its pytree of arrays stays there.

        Passed to :meth:`schedule`, it reaches each closure as its worker's
        :class:`~jaxcluster.coordinator.DeviceState` (``.value``, ``.assign(new)``).
        ``fetch()`` (or :meth:`fetch` of this coordinator) brings one or every worker's
        value here. A worker that fails or restarts runs ``init_fn`` again
        (``on_worker_restart="rebuild"``) or reports its state lost (``"lose"``: its element
        is ``ABORTED`` and closures using the state there fail with ``ClosureInputError``).

        With ``name``, the state survives this coordinator: a worker keeps it for its
        ``--state-ttl`` after this coordinator vanished (killed, not shut down), and a new
        coordinator (same token) asking for the same name re-attaches to the live value
        instead of running ``init_fn`` (``state.reattached``). A name still held by a live
        coordinator is taken over too; that coordinator's closures using it then fail.

        ``on_preemption`` is ``"rebuild"`` (the default: a worker replaced after a
        preemption notice runs ``init_fn`` as any restarted worker does) or ``"save"``: the
        moment a worker announces its preemption its value is copied here (a numpy pytree,
        before the notice's deadline), and the worker that next takes its index starts from
        the copy instead of ``init_fn``; a save that cannot finish in time is a WARNING and
        that worker runs ``init_fn`` (see ``device_state.py``).

        Example::

            state = coordinator.create_per_worker_state(
                lambda: {"step": np.zeros(())}, on_preemption="save"
            )
        """
        self._check_open()
        return PerWorkerState._create(
            self._host, init_fn, on_worker_restart, name or "", on_preemption
        )

    def create_per_worker_dataset(self, dataset_fn: Callable[[], Any]) -> PerWorkerDataset:
        """A dataset built on every worker by ``dataset_fn()`` (any iterable).

        ``iter()`` of it gives a new ``PerWorkerValues`` of worker-resident iterators, made
        asynchronously from a fresh ``dataset_fn()`` call on each worker.
        """
        self._check_open()
        return PerWorkerDataset(self._host, dataset_fn)

    # --- observation and lifetime -------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """Gauges ``queued``/``inflight``, counters ``completed``, ``failed``,
        ``cancelled``, ``retried``, ``worker_failures``, ``ps_failures`` (closure runs that
        failed on an unreachable parameter server, retried as transient or raised),
        ``functions_registered``, ``preemptions`` (notices workers announced, by source:
        ``{"gce": 1}``), ``kept_values_fetched``/``kept_bytes_fetched`` (kept values
        ``fetch()`` read from their holders, and their bytes), per-worker ``workers``
        (``index``, ``address``,
        ``state``, ``in_state_seconds``, ``last_error`` and this coordinator's
        ``completed``/``failed``/``retried``/``failures`` on that worker) and the
        ``latency`` histogram (schedule to result, seconds). All live: read when called,
        no RPC."""
        return self._dispatcher.metrics().to_dict()

    @property
    def session_id(self) -> str:
        """This coordinator's session (32 hex digits, or its strategy's ``session_id``):
        workers keep what it creates under it, apart from every other coordinator's."""
        return self._session_id

    @property
    def strategy(self) -> Any:
        """The strategy this coordinator was made with (TF's ``coordinator.strategy``), or
        ``None`` when it was made from a cluster resolver."""
        return self._strategy

    @property
    def workers(self) -> list[WorkerStatus]:
        """One typed ``WorkerStatus`` per worker, by index: ``address``, ``state`` (a
        ``WorkerState``, equal to its spelling: ``up``, ``recovering``, ``given_up``,
        ``removed`` after :meth:`remove_workers`, or ``preempting`` after the worker announced
        its preemption, with ``preemption_source`` and ``preemption_deadline``),
        ``last_error``, this coordinator's counts
        on it, and ``report``, what the worker reports about itself (``closures_run``,
        ``uptime_seconds``, ``jaxcluster_version``, ``platform``, ``incarnation``, ...).
        ``status["key"]``, ``status.get("key")`` and ``status.to_dict()`` read it as the
        dict it used to be.

        Example::

            serving = [w.address for w in coordinator.workers if w.state == "up"]

        Live: every worker that is up is asked for a fresh report first, all at once, each
        for at most one second (one small RPC per worker per read; nothing polls the
        workers while nobody reads). A worker that does not answer in time keeps its last
        report; ``metrics()`` is the no-RPC view.
        """
        if not self._closed:
            self._dispatcher.refresh_statuses(0.0, _WORKERS_STATUS_TIMEOUT_SECONDS)
        return list(self._dispatcher.worker_statuses())

    @property
    def metrics_address(self) -> str | None:
        """``HOST:PORT`` of the Prometheus endpoint (``/metrics``), or ``None`` without
        ``metrics_port``."""
        server = self._metrics_server
        return None if server is None else server.address

    @property
    def slices(self) -> list[list[str]]:
        """The hosts of every slice, rank 0 first, by worker index (one host each on an
        unsliced coordinator; a removed slice keeps its index and hosts here)."""
        return self._membership.slices()

    @property
    def cluster_resolver(self) -> Any:
        """The resolver the workers came from."""
        return self._cluster_resolver

    def shutdown(self) -> None:
        """Stops dispatching; queued closures are cancelled; the metrics endpoint, if
        any, closes. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._saver.stop()
        if self._refresher is not None:
            self._refresher.stop()
        self._dataflow.tracker.stop()
        # A strategy's ps variables are the ps's to release.
        shut_down(self._dispatcher, self._session_id, self._auth_token, self._tls_ca)
        server, self._metrics_server = self._metrics_server, None
        if server is not None:
            server.close()

    def __enter__(self) -> ClusterCoordinator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        active = list(self._membership.active())
        state = "shut down" if self._closed else f"{len(active)} workers"
        return f"<ClusterCoordinator {state}: {', '.join(active)}>"

    # --- internals ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this ClusterCoordinator has been shut down")

    def _pull(self, value: RemoteValue, timeout: float | None) -> Any:
        """A kept value, fetched from its holder (``RemoteValue.fetch``)."""
        self._check_open()
        return self._dataflow.pull(value, timeout)

    def _waiting_hint(self) -> str:
        """Why a closure may not have ended yet, from what the dispatcher knows."""
        if self._closed:
            return "the coordinator was shut down"
        return waiting_hint(self._dispatcher.worker_statuses())
