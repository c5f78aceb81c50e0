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
