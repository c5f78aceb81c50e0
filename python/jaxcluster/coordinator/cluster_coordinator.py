"""ClusterCoordinator: schedule closures on a cluster's workers, TF-style.

``schedule`` only serializes and enqueues; the Rust dispatcher moves closures to the
workers over gRPC (no GIL on that path), retries them when a worker fails, and settles each
closure's result cell, which :class:`RemoteValue` waits on with the GIL released.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from jaxcluster._auth import auth_token_from_env, warn_if_token_in_clear
from jaxcluster._tls import ca_from_env, load_ca
from jaxcluster.coordinator import _encoding
from jaxcluster.coordinator.device_state import PerWorkerState
from jaxcluster.coordinator.functions import FunctionSerializer, SerializedFunction
from jaxcluster.coordinator.per_worker import PerWorkerDataset, PerWorkerValues
from jaxcluster.coordinator.placement import WorkerFacts
from jaxcluster.coordinator.remote_value import RemoteValue
from jaxcluster.coordinator.structure import map_structure

__all__ = ["ClusterCoordinator"]

_ERROR_POLICIES = ("cancel_all", "per_closure")
_log = logging.getLogger("jaxcluster.coordinator")


def _resolver_and_token(source: Any) -> tuple[Any, str | None]:
    """``(resolver, token)`` from a cluster resolver or a strategy-like object."""
    if callable(getattr(source, "cluster_spec", None)):
        return source, None
    resolver = getattr(source, "cluster_resolver", None)
    if resolver is None:
        resolver = getattr(source, "_cluster_resolver", None)
    if resolver is None or not callable(getattr(resolver, "cluster_spec", None)):
        raise TypeError(
            f"ClusterCoordinator needs a cluster resolver (or a strategy with a "
            f"cluster_resolver), got {type(source).__qualname__}: {source!r}"
        )
    token = getattr(source, "auth_token", None)
    return resolver, token if isinstance(token, str) and token else None


def _worker_addresses(resolver: Any) -> list[str]:
    spec = resolver.cluster_spec()
    jobs = list(spec.jobs)
    if "worker" not in jobs:
        raise ValueError(
            f"the cluster has no 'worker' job (jobs: {', '.join(jobs) or 'none'}); the "
            "coordinator runs closures on the tasks of the 'worker' job"
        )
    tasks = list(spec.job_tasks("worker"))
    if not tasks:
        raise ValueError("the cluster's 'worker' job has no tasks; expected at least one")
    holes = [i for i, address in enumerate(tasks) if address is None]
    if holes:
        raise ValueError(
            f"the 'worker' job is sparse: no address for task(s) {holes}; the coordinator "
            "needs workers 0..n-1"
        )
    return [str(address) for address in tasks]


def _check_options(max_queue_size: int, error_policy: str, closure_timeout: Any) -> None:
    if isinstance(max_queue_size, bool) or not isinstance(max_queue_size, int):
        raise TypeError(f"max_queue_size={max_queue_size!r}; expected an int")
    if error_policy not in _ERROR_POLICIES:
        raise ValueError(
            f"error_policy={error_policy!r}; expected one of {', '.join(_ERROR_POLICIES)}"
        )
    if closure_timeout is not None and (
        isinstance(closure_timeout, bool)
        or not isinstance(closure_timeout, (int, float))
        or closure_timeout <= 0
    ):
        raise ValueError(
            f"closure_timeout={closure_timeout!r}; expected None or a positive number of seconds"
        )


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
    workers are reached over TLS and verified against that CA.

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
    ) -> None:
        if (cluster_resolver is None) == (strategy is None):
            raise TypeError(
                "ClusterCoordinator takes exactly one of cluster_resolver (positional) or "
                "strategy=; got " + ("both" if strategy is not None else "neither")
            )
        _check_options(max_queue_size, error_policy, closure_timeout)
        source = cluster_resolver if strategy is None else strategy
        resolver, strategy_token = _resolver_and_token(source)
        token = auth_token or strategy_token or auth_token_from_env()
        # A strategy's CA serves its workers too (it has the same cluster's certificates),
        # whether the strategy came positionally (SPEC: ClusterCoordinator(strategy)) or as
        # strategy=.
        strategy_ca = getattr(source, "tls_ca", None) if source is not resolver else None
        ca = load_ca(tls_ca) or (strategy_ca if isinstance(strategy_ca, bytes) else None)
        ca = ca or ca_from_env()
        self._auth_token, self._tls_ca = token, ca
        self._clients: dict[int, Any] = {}
        self._addresses = _worker_addresses(resolver)
        self._cluster_resolver = resolver
        self._strategy = None if source is resolver else source
        from jaxcluster._malloc import keep_freed_memory
        from jaxcluster._native import core

        keep_freed_memory()  # large arrays: no page faults per message (see _malloc)
        warn_if_token_in_clear(self._addresses, token, ca, _log, "workers")
        self._dispatcher = core.Dispatcher(
            self._addresses,
            auth_token=token,
            tls_ca=ca,
            max_queue_size=max_queue_size,
            error_policy=error_policy,  # type: ignore[arg-type]  # checked above
            closure_timeout=None if closure_timeout is None else float(closure_timeout),
        )
        self._worker_facts = WorkerFacts(self._dispatcher)
        self._functions = FunctionSerializer(self._worker_facts.platforms)
        self._registered: set[bytes] = set()
        self._lock = threading.Lock()
        self._closed = False

    # --- scheduling ------------------------------------------------------------------

    def schedule(
        self,
        fn: Callable[..., Any],
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> RemoteValue:
        """Enqueues ``fn(*args, **kwargs)`` for some worker; returns its RemoteValue.

        Blocks only while the queue is full. ``PerWorkerValues`` anywhere in the arguments
        become the executing worker's element; a ``RemoteValue`` there is a ``ValueError``.
        With ``error_policy="cancel_all"`` it raises a pending closure error (after
        enqueuing, so this closure is cancelled with the rest).
        """
        self._check_open()
        args = () if args is None else args
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(args, (tuple, list)):
            raise TypeError(
                f"schedule(args=...) must be a tuple or list, got {type(args).__qualname__}"
            )
        if not isinstance(kwargs, Mapping):
            raise TypeError(
                f"schedule(kwargs=...) must be a mapping, got {type(kwargs).__qualname__}"
            )
        if args or kwargs:
            encoded, resources = _encoding.encode_args(args, kwargs, self._resource_for)
            pickled, buffers = encoded.pickle, encoded.buffers
        else:
            pickled, buffers, resources = b"", [], []
        function = self._functions.serialize(fn, args, kwargs)
        self._worker_facts.check(function)
        self._register(function)
        cell = self._dispatcher.schedule(function.function_hash, pickled, buffers, resources)
        return RemoteValue(cell, function.origin)

    def join(self, timeout: float | None = None) -> bool:
        """Waits until every scheduled closure has ended; ``False`` if ``timeout`` passed.

        Raises the first closure error (``cancel_all``) once nothing is running any more.
        """
        self._check_open()
        return bool(self._dispatcher.join(timeout))

    def done(self) -> bool:
        """Whether every scheduled closure has ended; raises a pending closure error."""
        self._check_open()
        return bool(self._dispatcher.done())

    def fetch(self, val: Any) -> Any:
        """``val`` with every RemoteValue in it replaced by its fetched result.

        Nested tuples (named too), lists and dicts keep their shape; other leaves are
        returned as they are.
        """
        return map_structure(
            lambda x: x.fetch() if isinstance(x, (RemoteValue, PerWorkerState)) else x, val
        )

    def create_per_worker_state(
        self, init_fn: Callable[[], Any], *, on_worker_restart: str = "rebuild"
    ) -> PerWorkerState:
        """State kept on every worker's devices between closures: ``init_fn()`` runs on
        each worker and its pytree of arrays stays there.

        Passed to :meth:`schedule`, it reaches each closure as its worker's
        :class:`~jaxcluster.coordinator.DeviceState` (``.value``, ``.assign(new)``).
        ``fetch()`` (or :meth:`fetch` of this coordinator) brings one or every worker's
        value here. A worker that fails or restarts runs ``init_fn`` again
        (``on_worker_restart="rebuild"``) or reports its state lost (``"lose"``: its element
        is ``ABORTED`` and closures using the state there fail with ``ClosureInputError``).
        """
        self._check_open()
        return PerWorkerState._create(self, init_fn, on_worker_restart)

    def create_per_worker_dataset(self, dataset_fn: Callable[[], Any]) -> PerWorkerDataset:
        """A dataset built on every worker by ``dataset_fn()`` (any iterable).

        ``iter()`` of it gives a new ``PerWorkerValues`` of worker-resident iterators, made
        asynchronously from a fresh ``dataset_fn()`` call on each worker.
        """
        self._check_open()
        return PerWorkerDataset(self, dataset_fn)

    # --- observation and lifetime -------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """Gauges ``queued``/``inflight``, counters ``completed``, ``failed``, ``retried``,
        ``worker_failures``, ``ps_failures`` (closure runs that failed on an unreachable
        parameter server, retried as transient or raised), ``functions_registered``,
        per-worker ``workers`` and the ``latency`` histogram (schedule to result,
        seconds)."""
        return dict(self._dispatcher.metrics())

    @property
    def strategy(self) -> Any:
        """The strategy this coordinator was made with (TF's ``coordinator.strategy``), or
        ``None`` when it was made from a cluster resolver."""
        return self._strategy

    @property
    def workers(self) -> list[dict[str, Any]]:
        """One dict per worker, by index: ``address``, ``state`` (``up``, ``recovering``
        or ``given_up``) and what the worker last reported about itself."""
        return list(self._dispatcher.worker_statuses())

    @property
    def cluster_resolver(self) -> Any:
        """The resolver the workers came from."""
        return self._cluster_resolver

    def shutdown(self) -> None:
        """Stops dispatching; queued closures are cancelled. Idempotent."""
        self._closed = True
        self._dispatcher.shutdown()

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
        state = "shut down" if self._closed else f"{len(self._addresses)} workers"
        return f"<ClusterCoordinator {state}: {', '.join(self._addresses)}>"

    # --- internals used by per-worker values ---------------------------------------------

    @property
    def _num_workers(self) -> int:
        return len(self._addresses)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this ClusterCoordinator has been shut down")

    def _register(self, function: SerializedFunction) -> None:
        if function.function_hash in self._registered:
            return
        with self._lock:
            if function.function_hash not in self._registered:
                self._dispatcher.register_function(
                    function.function_hash, function.kind, function.payload
                )
                self._registered.add(function.function_hash)

    def _create_resource(self, fn: Callable[[], Any], rebuild: bool = True) -> Any:
        self._check_open()
        function = self._functions.serialize(fn, (), {})
        self._register(function)
        return self._dispatcher.create_resource(function.function_hash, rebuild=rebuild)

    def _worker_client(self, worker: int) -> Any:
        """A direct client of one worker (for reads of its per-worker state), made once."""
        client = self._clients.get(worker)
        if client is None:
            from jaxcluster._native import core

            client = core.WorkerClient(
                self._addresses[worker], auth_token=self._auth_token, tls_ca=self._tls_ca
            )
            self._clients[worker] = client
        return client

    def _resource_for(self, value: PerWorkerValues) -> Any:
        return value._resource_for(self)
