"""Type stubs for the native module ``jaxcluster._core`` (Rust, PyO3)."""

__version__: str

# --- Worker protocol (rust/py/worker.rs, rust/py/client.rs) --------------------------------
# Everything below is blocking and releases the GIL while it waits; waits wake every
# 50-100 ms to let signal handlers (Ctrl-C) run. Failed RPCs raise the jaxcluster.errors
# class of their gRPC code: UnauthenticatedError, UnavailableError, NotFoundError,
# InvalidArgumentError, ResourceExhaustedError, DeadlineExceededError, CancelledError,
# FailedPreconditionError, AbortedError, InternalError.

from collections.abc import Sequence
from typing import Any, Literal, final

from typing_extensions import Self

@final
class WorkerServer:
    """The gRPC server of a worker process, serving ``jaxcluster.v1.Worker``.

    Requests that run code are queued for one executor thread, which takes them with
    :meth:`next_job` and answers each exactly once.

    Example::

        server = WorkerServer("127.0.0.1:0", auth_token="s3cret", worker_index=0)
        print(server.address)           # '127.0.0.1:41234'
        job = server.next_job(timeout=1.0)
        if job is not None:
            job.reply_status("INTERNAL", "not implemented here")
        server.shutdown(timeout=10.0)
    """

    def __new__(
        cls,
        address: str = "127.0.0.1:0",
        *,
        auth_token: str | None = None,
        worker_index: int = 0,
        max_message_bytes: int = ...,
        devices: Sequence[tuple[str, str]] = ...,
        jax_version: str = ...,
        platform: str = ...,
    ) -> Self:
        """Binds ``address`` (port 0 picks a free port) and starts serving.

        Raises ``ValueError`` for a bad setting, including a non-loopback address without
        ``auth_token``, and ``OSError`` when the address cannot be bound. ``devices`` are
        ``(tf_name, device_type)`` pairs reported by ``ListDevices``; ``max_message_bytes``
        defaults to 64 MiB.
        """

    @property
    def address(self) -> str:
        """``host:port`` actually bound."""

    @property
    def port(self) -> int:
        """The port actually bound."""

    @property
    def draining(self) -> bool:
        """Whether shutdown has begun."""

    def next_job(self, timeout: float | None = None) -> WorkerJob | None:
        """The next job, or ``None`` after ``timeout`` seconds or once the server is
        draining with nothing left. Raises ``RuntimeError`` if the previous job is not
        answered yet (one job at a time)."""

    def begin_shutdown(self) -> bool:
        """Stops taking closures: new and queued ones get ``UNAVAILABLE`` so a coordinator
        retries them elsewhere; the running one finishes. ``False`` if already begun.
        Safe to call from a signal handler."""

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Waits until shutdown has begun and no job is queued or running."""

    def shutdown(self, timeout: float | None = None) -> bool:
        """Begins shutdown, waits up to ``timeout`` for the running job, then stops
        serving. Returns whether it drained in time. Do not call it from the executor
        thread while that thread holds an unanswered job."""

    def status(self) -> dict[str, Any]:
        """What ``GetStatus`` would answer (same keys as :meth:`WorkerClient.get_status`)."""

@final
class WorkerJob:
    """One request taken by the executor; answer it exactly once.

    A job dropped without an answer replies ``INTERNAL`` so its caller never hangs.
    """

    @property
    def kind(self) -> Literal["run", "create_resource", "release_resource"]: ...
    @property
    def closure_id(self) -> int | None:
        """The coordinator's closure id (``run`` jobs)."""

    @property
    def resource_id(self) -> int | None:
        """The resource to create (``create_resource`` jobs)."""

    @property
    def resource_ids(self) -> list[int]:
        """The resources to drop (``release_resource`` jobs)."""

    @property
    def function_hash(self) -> bytes | None:
        """SHA-256 of the function payload (``run`` and ``create_resource`` jobs)."""

    @property
    def function_kind(self) -> Literal["cloudpickle", "jax_export"] | None: ...
    @property
    def function_payload(self) -> bytes | None:
        """The registered payload; copied on each access, so read it only on a cache miss."""

    @property
    def args(self) -> bytes | None:
        """The pickled ``(args, kwargs)``, or ``None`` when the request had no arguments."""

    @property
    def buffers(self) -> list[bytes]:
        """The out-of-band buffers of :attr:`args`."""

    @property
    def replied(self) -> bool:
        """Whether the job has been answered."""

    def reply_ok(
        self, value: bytes | None = None, buffers: Sequence[bytes] = ..., *, released: int = 0
    ) -> None:
        """Answers success: ``run`` needs the pickled result ``value`` (and its buffers);
        ``create_resource`` takes nothing; ``release_resource`` takes the ``released``
        count."""

    def reply_error(
        self,
        kind: Literal["user", "input", "function_load", "infrastructure"],
        type_name: str,
        module: str,
        message: str,
        traceback: str,
        *,
        exception: bytes | None = None,
        exception_buffers: Sequence[bytes] = ...,
        resource_id: int | None = None,
    ) -> None:
        """Answers a ``run``/``create_resource`` job with a structured closure error."""

    def reply_status(self, code: str, message: str) -> None:
        """Answers with an RPC error: ``code`` is a gRPC code name such as
        ``"INVALID_ARGUMENT"``, ``"NOT_FOUND"``, ``"UNAVAILABLE"`` or ``"INTERNAL"``."""

@final
class WorkerClient:
    """A blocking client for one worker; connects lazily and reconnects by itself.

    Example::

        client = WorkerClient("127.0.0.1:41234", auth_token="s3cret")
        client.get_status()["worker_index"]         # 0
        client.list_devices()[0]["device_type"]     # 'CPU'
    """

    def __new__(
        cls,
        address: str,
        auth_token: str | None = None,
        timeout: float | None = ...,
        *,
        connect_timeout: float = 10.0,
        max_message_bytes: int = ...,
    ) -> Self:
        """``address`` is ``host:port`` (optionally ``grpc://``). ``timeout`` bounds the
        control calls (status, devices, register, release) unless they pass their own
        (default 30 s); ``max_message_bytes`` defaults to 64 MiB."""

    @property
    def address(self) -> str: ...
    def get_status(self, timeout: float | None = None) -> dict[str, Any]:
        """``state`` ('serving' | 'draining'), ``worker_index``, ``jaxcluster_version``,
        ``jax_version``, ``platform``, ``functions_registered``, ``closures_run``,
        ``closures_failed``, ``queued``, ``inflight``, ``resources_created``,
        ``resources_released``, ``unauthenticated_requests``, ``rejected_requests``,
        ``pid``, ``uptime_seconds``, ``protocol_revision``."""

    def list_devices(self, timeout: float | None = None) -> list[dict[str, str]]:
        """``[{"name": "/job:worker/replica:0/task:0/device:CPU:0", "device_type": "CPU"}]``."""

    def register_function(
        self, function_hash: bytes, kind: str, payload: bytes, *, timeout: float | None = None
    ) -> bool:
        """Stores ``payload`` (``kind`` 'cloudpickle' or 'jax_export') under its 32-byte
        SHA-256 ``function_hash``; returns whether the worker already held it."""

    def run_closure(
        self,
        function_hash: bytes,
        args: bytes | None = None,
        buffers: Sequence[bytes] = ...,
        *,
        closure_id: int = 0,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Runs a registered function on pickled ``(args, kwargs)``. Returns
        ``{"closure_id", "value", "buffers", "error"}``: ``value``/``buffers`` hold the
        pickled result, or ``error`` is a dict with ``kind`` ('user' | 'input' |
        'function_load' | 'infrastructure'), ``type_name``, ``module``, ``message``,
        ``traceback``, ``exception`` (pickled, or None), ``exception_buffers`` and
        ``resource_id``. ``timeout=None`` waits as long as the closure runs."""

    def create_resource(
        self,
        resource_id: int,
        function_hash: bytes,
        args: bytes | None = None,
        buffers: Sequence[bytes] = ...,
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Runs a registered function and keeps its result on the worker under
        ``resource_id``. Returns ``{"resource_id", "error"}`` (``error`` as in
        :meth:`run_closure`, or None)."""

    def release_resource(self, resource_ids: Sequence[int], *, timeout: float | None = None) -> int:
        """Drops resources on the worker; returns how many it held."""

# --- Dispatcher (rust/py/dispatch.rs) --------------------------------------------------------
# The coordinator's Rust dispatcher: one thread per worker moves closures over gRPC with no
# GIL on that path. Every wait releases the GIL and wakes every 50 ms for signal handlers, so
# Ctrl-C interrupts it. A closure's failure is raised as the exception that
# ``jaxcluster.coordinator._errors.build_exception(result_tuple)`` builds (until that module
# exists: ``RemoteError``, ``ClosureInputError`` or the ``jaxcluster.errors`` class of the
# gRPC code).

@final
class Dispatcher:
    """Moves closures to the workers at ``addresses`` (index = worker index).

    Work-conserving as TF's coordinator: each worker runs one closure at a time and a
    closure never waits behind a busy worker while another is idle. A worker that fails
    (unreachable, shutting down, restarted) gets its closure put back for another worker;
    it is probed with exponential backoff capped at 10 s, its per-worker resources are
    rebuilt when it answers, and it is given up after ``recovery_timeout`` seconds
    (default ``JAXCLUSTER_WORKER_RECOVERY_SEC``, else 3600). Once every worker was given
    up, closures fail with ``UnavailableError`` instead of waiting. Creating a dispatcher
    never blocks on the workers. ``TF_COORDINATOR_SCHEDULE_START_DELAY`` /
    ``TF_COORDINATOR_SCHEDULE_START_DELAY_MAX`` (or ``JAXCLUSTER_COORDINATOR_…``) stagger
    the workers' start as in TF.

    Example::

        payload = cloudpickle.dumps(fn)
        fn_hash = hashlib.sha256(payload).digest()
        d = Dispatcher(["127.0.0.1:8470"], auth_token=token)
        d.register_function(fn_hash, 0, payload)
        cell = d.schedule(fn_hash, args_pickle, [], [])
        cell.wait()
        status, pickle, buffers = cell.result()
        d.shutdown()
    """

    def __new__(
        cls,
        addresses: list[str],
        *,
        auth_token: str | None = None,
        max_queue_size: int = 262144,
        error_policy: Literal["cancel_all", "per_closure"] = "cancel_all",
        closure_timeout: float | None = None,
        recovery_timeout: float | None = None,
        max_message_bytes: int = 67108864,
    ) -> Self:
        """``max_queue_size <= 0`` means unbounded. ``error_policy='cancel_all'`` (TF's)
        raises the first closure error from the next :meth:`schedule`, :meth:`join` or
        :meth:`done`, cancelling every queued closure; ``'per_closure'`` keeps each error
        on its own :class:`ResultCell`. ``closure_timeout`` (seconds) bounds one execution:
        on expiry the closure is retried once on another worker, then fails with
        ``DeadlineExceededError`` naming the workers; the timed-out worker gets no new work
        until it reports idle. Raises ``ValueError`` for a bad argument or environment
        variable and ``InvalidArgumentError`` for an address that is not ``HOST:PORT``."""

    def register_function(self, hash: bytes, kind: int, payload: bytes) -> None:
        """Registers a function payload (``kind`` 0: cloudpickle, 1: ``jax.export``
        serialization) under ``hash``, its 32-byte SHA-256 (checked). Each worker is sent
        the payload the first time a closure there needs it, and again after it restarts.
        Idempotent."""

    def schedule(
        self,
        function_hash: bytes,
        args: bytes,
        buffers: Sequence[bytes],
        resources: Sequence[PerWorkerResource],
    ) -> ResultCell:
        """Queues a closure of a registered function: ``args`` is the pickled
        ``(args, kwargs)`` (empty for none), ``buffers`` its out-of-band buffers
        (bytes-like), ``resources`` the per-worker resources the arguments refer to (as
        ``ResourceRef(resource_id)``). Blocks with the GIL released while the queue is full.
        Under ``cancel_all`` a pending closure error is raised after queuing, so this
        closure is cancelled with the rest (as TF does). ``ValueError`` for an unknown
        function or a released resource; ``RuntimeError`` after :meth:`shutdown`."""

    def create_resource(self, function_hash: bytes) -> PerWorkerResource:
        """Builds a per-worker resource: each worker runs the registered function (no
        arguments) and keeps the result, ahead of the closures queued after this call.
        Returns at once; never raises the function's error (a closure using a resource whose
        build failed on its worker fails with ``ClosureInputError``)."""

    def join(self, timeout: float | None = None) -> bool:
        """Waits until nothing is queued or running: ``True``, or ``False`` when
        ``timeout`` seconds passed first. Raises the pending closure error (after cancelling
        what is queued and waiting for what runs)."""

    def done(self) -> bool:
        """Whether nothing is queued or running; raises the pending closure error."""

    def metrics(self) -> dict[str, Any]:
        """Gauges ``queued``, ``inflight``; counters ``completed``, ``failed``,
        ``cancelled``, ``retried``, ``worker_failures``, ``functions_registered`` (payloads
        sent to workers); ``workers`` (``[{"address", "state"}]``, state ``'up'`` |
        ``'recovering'`` | ``'given_up'``); ``latency``: schedule-to-result seconds as
        ``{"bounds", "counts", "count", "sum", "max", "p50", "p99"}`` (``counts`` has one
        more entry than ``bounds``, for larger values; quantiles are bucket upper bounds,
        None before the first result)."""

    def worker_statuses(self) -> list[dict[str, Any]]:
        """Per worker: ``index``, ``address``, ``state``, ``in_state_seconds``,
        ``last_error`` (str or None) and, once the worker answered, the fields of its last
        ``GetStatus`` (``platform``, ``jax_version``, ``pid``, ``worker_index``, counters...;
        its own ``'serving'``/``'draining'`` as ``serving_state``)."""

    def shutdown(self) -> None:
        """Stops dispatching: running RPCs are abandoned, queued and running closures are
        cancelled (their cells become ABORTED), worker threads end. Idempotent; also done
        when the dispatcher is garbage-collected."""

    @property
    def num_workers(self) -> int: ...

@final
class ResultCell:
    """Where one closure's outcome lands, exactly once."""

    def wait(self, timeout: float | None = None) -> bool:
        """Waits (GIL released, Ctrl-C interruptible) until the closure ended; ``False`` if
        ``timeout`` seconds passed first."""

    @property
    def status(self) -> int:
        """0 NOT_READY, 1 ABORTED (cancelled), 2 READY (a value or an error)."""

    @property
    def closure_id(self) -> int:
        """The closure's id, as the worker saw it."""

    def result(
        self,
    ) -> (
        tuple[Literal["ok"], bytes, list[bytes]]
        | tuple[Literal["error"], str, str, str, str, str, bytes, str]
        | tuple[Literal["cancelled"], str]
    ):
        """``("ok", pickle, buffers)``; ``("error", kind, type_name, module, message,
        traceback, pickled_exception, worker)`` with ``kind`` ``'user'`` | ``'input'`` |
        ``'infra:<GRPC_CODE_NAME>'`` and ``pickled_exception`` empty when the worker could
        not pickle it; or ``("cancelled", message)``. ``RuntimeError`` while NOT_READY."""

@final
class PerWorkerResource:
    """A value built on every worker (e.g. a dataset iterator) by
    :meth:`Dispatcher.create_resource`. Released on the workers by :meth:`release`, or when
    this handle and every closure using it are gone."""

    @property
    def num_workers(self) -> int: ...
    @property
    def resource_id(self) -> int:
        """What closure arguments carry (``wire.ResourceRef(resource_id)``)."""

    def state(self, worker: int) -> Literal["pending", "ready", "failed", "aborted"]:
        """The resource's state on ``worker`` (``IndexError`` when out of range); aborted
        when lost with its worker (rebuilt when it returns) or released."""

    def release(self) -> None:
        """Releases it on every worker now; later schedules with it raise ``ValueError``.
        Idempotent."""
