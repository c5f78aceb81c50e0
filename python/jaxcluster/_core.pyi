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

# --- Parameter servers (rust/py/ps.rs) -------------------------------------------------------
# Values go in as anything numpy.asarray accepts (numpy and JAX arrays, numbers,
# lists) of dtype float16, bfloat16 (ml_dtypes), float32, float64, int8..int64 or
# uint8..uint64, and come back as new writable numpy arrays. Errors as above; a value of
# another dtype or shape than its variable -> InvalidArgumentError naming both; an unknown
# variable -> NotFoundError; an unsupported dtype -> TypeError before any RPC.

from typing import overload  # noqa: E402 - appended section

import numpy as np  # noqa: E402

@final
class PsServer:
    """A parameter server serving ``jaxcluster.v1.ParameterServer`` entirely on Rust
    threads (no request takes the GIL). Variables live in memory until the server stops.

    Example::

        server = PsServer("127.0.0.1:0", auth_token="s3cret", index=0)
        print(server.address)           # '127.0.0.1:41234'
        server.shutdown()
    """

    def __new__(
        cls,
        address: str = "127.0.0.1:0",
        *,
        auth_token: str | None = None,
        index: int = 0,
        max_message_bytes: int = ...,
    ) -> Self:
        """Binds ``address`` (port 0 picks a free port) and starts serving. Raises
        ``ValueError`` for a bad setting, including a non-loopback address without
        ``auth_token`` or a negative ``index``, and ``OSError`` when the address cannot be
        bound. ``max_message_bytes`` defaults to 64 MiB."""

    @property
    def address(self) -> str:
        """``host:port`` actually bound."""

    @property
    def port(self) -> int:
        """The port actually bound."""

    @property
    def index(self) -> int:
        """This task's index in the ``ps`` job."""

    def status(self) -> dict[str, Any]:
        """The same dict as :meth:`PsClient.get_status`."""

    def shutdown(self) -> None:
        """Stops accepting connections and lets in-flight requests finish (up to 5 s).
        Idempotent."""

@final
class PsClient:
    """A blocking client for one ps task; connects lazily and reconnects by itself (a
    restarted ps is usable as soon as it answers, but starts empty). Safe to share
    between threads; calls release the GIL while they wait.

    Example::

        client = PsClient("127.0.0.1:41234", auth_token="s3cret")
        client.create_variable("w", np.zeros(3, np.float32))
        client.assign_add("w", np.ones(3, np.float32))        # 1 (the new version)
        client.read("w")                                       # array([1., 1., 1.], ...)
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
        """``address`` is ``host:port`` (optionally ``grpc://``). ``timeout`` bounds each
        call unless it passes its own (default 30 s; ``None``: no limit)."""

    @property
    def address(self) -> str: ...
    def get_status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """``ps_index``, ``jaxcluster_version``, ``protocol_revision``, ``incarnation``
        (random per process: changes when the ps restarts), ``variables``,
        ``variable_bytes``, ``reads``, ``updates``, ``variables_created``,
        ``unauthenticated_requests``, ``rejected_requests``, ``pid``, ``uptime_seconds``."""

    def create_variable(
        self,
        name: str,
        initial_value: Any,
        *,
        replace: bool = False,
        timeout: float | None = None,
    ) -> bool:
        """Creates ``name`` with the value's dtype and shape; returns whether an existing
        variable was replaced. Without ``replace`` an existing name raises
        ``FailedPreconditionError``."""

    def read(self, name: str, *, timeout: float | None = None) -> np.ndarray:
        """A consistent copy of the variable (never half of an update)."""

    def read_versioned(self, name: str, *, timeout: float | None = None) -> tuple[np.ndarray, int]:
        """The value and its version (updates applied since creation)."""

    @overload
    def assign(
        self,
        name: str,
        value: Any,
        *,
        read_value: Literal[False] = False,
        timeout: float | None = None,
    ) -> int:
        """``variable = value`` (same dtype and shape). Returns the new version, or with
        ``read_value=True`` the value right after this update."""
    @overload
    def assign(
        self, name: str, value: Any, *, read_value: Literal[True], timeout: float | None = None
    ) -> np.ndarray: ...
    @overload
    def assign_add(
        self,
        name: str,
        delta: Any,
        *,
        read_value: Literal[False] = False,
        timeout: float | None = None,
    ) -> int:
        """``variable += delta`` atomically (integers wrap around). Returns as
        :meth:`assign`."""
    @overload
    def assign_add(
        self, name: str, delta: Any, *, read_value: Literal[True], timeout: float | None = None
    ) -> np.ndarray: ...
    @overload
    def assign_sub(
        self,
        name: str,
        delta: Any,
        *,
        read_value: Literal[False] = False,
        timeout: float | None = None,
    ) -> int:
        """``variable -= delta`` atomically. Returns as :meth:`assign`."""
    @overload
    def assign_sub(
        self, name: str, delta: Any, *, read_value: Literal[True], timeout: float | None = None
    ) -> np.ndarray: ...
    def scatter_add(
        self,
        name: str,
        indices: Any,
        updates: Any,
        *,
        read_value: bool = False,
        timeout: float | None = None,
    ) -> int | np.ndarray:
        """``variable[indices[i], ...] += updates[i, ...]`` atomically; ``indices`` is an
        integer scalar or 1-D array, ``updates`` has shape ``[len(indices)] +
        variable.shape[1:]``. An index out of range changes nothing. Returns as
        :meth:`assign`."""

    def list_variables(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """``[{"name", "dtype", "shape", "version"}]`` sorted by name."""

    def read_many(
        self, names: Sequence[str] | None = None, *, timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        """Copies of ``names`` (every variable when ``None``), each consistent on its own."""

    def assign_many(
        self,
        values: Sequence[tuple[str, Any]],
        *,
        create_missing: bool = False,
        timeout: float | None = None,
    ) -> tuple[int, int]:
        """Assigns every ``(name, value)``, all or nothing: any mismatch or unknown name
        (without ``create_missing``) changes nothing. Returns ``(assigned, created)``."""

    def delete_variables(self, names: Sequence[str], *, timeout: float | None = None) -> int:
        """Drops variables; returns how many existed."""
