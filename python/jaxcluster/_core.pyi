"""Type stubs for the native module ``jaxcluster._core`` (Rust, PyO3)."""

from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import Any, Literal, Protocol, Self, TypeAlias, final, overload

import numpy as np

__version__: str

def refresh_log_levels() -> None:
    """Forgets the cached levels of the ``jaxcluster`` loggers, so that a logging
    configuration made just now applies to the next event from Rust. Rust events are
    forwarded to ``logging.getLogger(<target>)`` (``jaxcluster.dispatch``,
    ``jaxcluster.worker``, ``jaxcluster.ps``, ``jaxcluster.auth``, ``jaxcluster.settings``;
    dependencies' warnings under ``jaxcluster.deps``) after a level check against a cache
    refreshed every second (rust/py/log.rs)."""

# Every call that can wait releases the GIL while it waits and wakes every 50 ms to take it
# just long enough to run Python's signal handlers, so Ctrl-C (or any handler that raises)
# interrupts it with the handler's exception (rust/py/blocking.rs).
#
# Names, one spelling each (rust/rpc/wire/codes.rs owns the tables): gRPC status codes by their
# canonical names ("DEADLINE_EXCEEDED"); function kinds "cloudpickle" | "jax_export";
# closure-error kinds "user" | "input" | "function_load" | "infrastructure" (and
# "cancelled" for a ClosureError of a cancelled closure), given to Python as the enums below
# (FunctionKind, ErrorKind, WorkerState, ServingState, ResourceState), each equal to and
# hashing like its spelling. Failed RPCs raise the
# jaxcluster.errors class of their gRPC code: UnauthenticatedError, UnavailableError,
# NotFoundError, InvalidArgumentError, ResourceExhaustedError, DeadlineExceededError,
# CancelledError, FailedPreconditionError, AbortedError, InternalError.

_FunctionKind: TypeAlias = "FunctionKind | Literal['cloudpickle', 'jax_export']"

# --- Enums (rust/py/enums.rs) ---------------------------------------------------------------

@final
class WorkerState:
    """A worker's state as the coordinator's link sees it.

    Equal to, and hashing like, its spelling (``WorkerState.UP == "up"``),
    so callers holding strings keep working; ``str()`` and ``.value`` give the spelling."""

    UP: WorkerState  # 'up'
    RECOVERING: WorkerState  # 'recovering'
    GIVEN_UP: WorkerState  # 'given_up'
    REMOVED: WorkerState  # 'removed'
    PREEMPTING: WorkerState  # 'preempting'
    def __new__(cls, value: str) -> Self:
        """The variant spelled ``value`` (``ValueError`` if none is)."""

    @property
    def value(self) -> str:
        """The spelling."""

    @property
    def name(self) -> str:
        """The variant's Python name (``UP``)."""

    @staticmethod
    def members() -> list[WorkerState]:
        """Every variant, in declaration order."""

    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Self], tuple[str]]: ...

@final
class ServingState:
    """A worker's own serving state, as its ``GetStatus`` reports it.

    Equal to, and hashing like, its spelling (``ServingState.SERVING == "serving"``),
    so callers holding strings keep working; ``str()`` and ``.value`` give the spelling."""

    SERVING: ServingState  # 'serving'
    DRAINING: ServingState  # 'draining'
    PREEMPTING: ServingState  # 'preempting'
    UNSPECIFIED: ServingState  # 'unspecified'
    def __new__(cls, value: str) -> Self:
        """The variant spelled ``value`` (``ValueError`` if none is)."""

    @property
    def value(self) -> str:
        """The spelling."""

    @property
    def name(self) -> str:
        """The variant's Python name (``SERVING``)."""

    @staticmethod
    def members() -> list[ServingState]:
        """Every variant, in declaration order."""

    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Self], tuple[str]]: ...

@final
class FunctionKind:
    """How a registered function's payload is encoded.

    Equal to, and hashing like, its spelling (``FunctionKind.CLOUDPICKLE == "cloudpickle"``),
    so callers holding strings keep working; ``str()`` and ``.value`` give the spelling."""

    CLOUDPICKLE: FunctionKind  # 'cloudpickle'
    JAX_EXPORT: FunctionKind  # 'jax_export'
    def __new__(cls, value: str) -> Self:
        """The variant spelled ``value`` (``ValueError`` if none is)."""

    @property
    def value(self) -> str:
        """The spelling."""

    @property
    def name(self) -> str:
        """The variant's Python name (``CLOUDPICKLE``)."""

    @staticmethod
    def members() -> list[FunctionKind]:
        """Every variant, in declaration order."""

    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Self], tuple[str]]: ...

@final
class ErrorKind:
    """Why a closure did not produce a value (``ClosureError.kind``).

    Equal to, and hashing like, its spelling (``ErrorKind.USER == "user"``),
    so callers holding strings keep working; ``str()`` and ``.value`` give the spelling."""

    USER: ErrorKind  # 'user'
    INPUT: ErrorKind  # 'input'
    FUNCTION_LOAD: ErrorKind  # 'function_load'
    INFRASTRUCTURE: ErrorKind  # 'infrastructure'
    CANCELLED: ErrorKind  # 'cancelled'
    def __new__(cls, value: str) -> Self:
        """The variant spelled ``value`` (``ValueError`` if none is)."""

    @property
    def value(self) -> str:
        """The spelling."""

    @property
    def name(self) -> str:
        """The variant's Python name (``USER``)."""

    @staticmethod
    def members() -> list[ErrorKind]:
        """Every variant, in declaration order."""

    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Self], tuple[str]]: ...

@final
class ResourceState:
    """Where a per-worker resource stands on one worker.

    Equal to, and hashing like, its spelling (``ResourceState.PENDING == "pending"``),
    so callers holding strings keep working; ``str()`` and ``.value`` give the spelling."""

    PENDING: ResourceState  # 'pending'
    READY: ResourceState  # 'ready'
    FAILED: ResourceState  # 'failed'
    ABORTED: ResourceState  # 'aborted'
    LOST: ResourceState  # 'lost'
    def __new__(cls, value: str) -> Self:
        """The variant spelled ``value`` (``ValueError`` if none is)."""

    @property
    def value(self) -> str:
        """The spelling."""

    @property
    def name(self) -> str:
        """The variant's Python name (``PENDING``)."""

    @staticmethod
    def members() -> list[ResourceState]:
        """Every variant, in declaration order."""

    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Self], tuple[str]]: ...

# --- Status records (rust/py/status.rs, rust/py/metrics.rs) ---------------------------------

@final
class WorkerReport:
    """What a worker reports about itself (``WorkerClient.get_status()``).

    Example: ``WorkerClient(address).get_status().platform``

    Frozen. ``to_dict()`` gives the plain dict this call returned before it was typed
    (enums as their spellings, nested records as dicts); ``record[key]`` and
    ``record.get(key)`` read that dict, so code written against it keeps working."""

    @property
    def state(self) -> ServingState:
        """Its own serving state (``serving``/``draining``)."""

    @property
    def worker_index(self) -> int: ...
    @property
    def jaxcluster_version(self) -> str: ...
    @property
    def jax_version(self) -> str: ...
    @property
    def python_version(self) -> str:
        """The worker's Python (``major.minor.micro``); empty from older workers."""
    @property
    def platform(self) -> str:
        """JAX platform (``cpu``, ``gpu``, ``tpu``); empty before JAX loaded."""

    @property
    def device_count(self) -> int: ...
    @property
    def device_kind(self) -> str: ...
    @property
    def closure_bytes_received(self) -> int: ...
    @property
    def closure_bytes_sent(self) -> int: ...
    @property
    def functions_registered(self) -> int: ...
    @property
    def closures_run(self) -> int: ...
    @property
    def closures_failed(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def inflight(self) -> int: ...
    @property
    def resources_created(self) -> int: ...
    @property
    def resources_released(self) -> int: ...
    @property
    def unauthenticated_requests(self) -> int: ...
    @property
    def rejected_requests(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def uptime_seconds(self) -> float: ...
    @property
    def protocol_revision(self) -> int: ...
    @property
    def previous_exit(self) -> str: ...
    @property
    def connections_open(self) -> int: ...
    @property
    def connections_dropped(self) -> int: ...
    @property
    def incarnation(self) -> int:
        """Random per worker server process (0 from a worker too old to say)."""

    @property
    def last_error(self) -> str:
        """Its own last closure error (empty if none)."""

    @property
    def slice_index(self) -> int | None: ...
    @property
    def slice_rank(self) -> int | None: ...
    @property
    def slice_size(self) -> int | None: ...
    @property
    def preemption_source(self) -> str | None:
        """Who announced the worker's preemption (``'gce'``, ``'aws'``, ``'signal'``);
        ``None`` without a notice."""

    @property
    def preemption_deadline(self) -> float | None:
        """When the worker expects to be gone, seconds since the epoch; ``None`` without
        a notice or a deadline."""

    @property
    def preemption_detail(self) -> str | None:
        """What the notice said (``'instance/preempted=TRUE'``, ``'SIGUSR1'``)."""

    @property
    def sessions(self) -> list[SessionHeld]:
        """The sessions (coordinators) this worker holds values for; empty from a worker
        that predates sessions."""

    @property
    def state_ttl_seconds(self) -> float:
        """How long a vanished session's values are kept (``--state-ttl``)."""

    @property
    def peer_bytes_sent(self) -> int:
        """(Dataflow.) Bytes of kept values read from this worker (``ReadValue``)."""

    @property
    def peer_bytes_received(self) -> int:
        """(Dataflow.) Bytes of kept values this worker pulled from other workers."""

    @property
    def peer_reads_served(self) -> int: ...
    @property
    def peer_pulls(self) -> int: ...
    def to_dict(self) -> dict[str, Any]:
        """The plain dict (for JSON, Prometheus and callers written against it)."""

    def __getitem__(self, key: str, /) -> Any:
        """``to_dict()[key]``."""

    def get(self, key: str, default: Any = None) -> Any:
        """``to_dict().get(key, default)``."""

    def keys(self) -> list[str]:
        """``to_dict()``'s keys."""

@final
class WorkerStatus:
    """One worker as the coordinator sees it (``Dispatcher.worker_statuses()``,
    ``ClusterCoordinator.workers``): the link's state and counts and the worker's last report.

    Example: ``[w.address for w in coordinator.workers if w.state == "up"]``

    Frozen. ``to_dict()`` gives the plain dict this call returned before it was typed
    (enums as their spellings, nested records as dicts); ``record[key]`` and
    ``record.get(key)`` read that dict, so code written against it keeps working."""

    @property
    def index(self) -> int: ...
    @property
    def address(self) -> str: ...
    @property
    def state(self) -> WorkerState:
        """The link's state: up, recovering, given_up or removed; ``preempting`` while a
        worker that announced its preemption is up or awaited."""

    @property
    def in_state_seconds(self) -> float: ...
    @property
    def last_error(self) -> str | None:
        """The link's last failure talking to the worker."""

    @property
    def completed(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def retried(self) -> int: ...
    @property
    def failures(self) -> int: ...
    @property
    def report(self) -> WorkerReport | None:
        """The worker's last ``GetStatus`` answer, once it answered."""

    @property
    def status_age_seconds(self) -> float | None:
        """How old ``report`` is."""

    @property
    def uptime_seconds(self) -> float | None:
        """The report's uptime, carried forward to now while the worker is up."""

    @property
    def preemption_source(self) -> str | None:
        """Who announced this worker's preemption (``'gce'``, ``'aws'``, ``'signal'``);
        ``None`` unless it is ``preempting``."""

    @property
    def preemption_deadline(self) -> float | None:
        """When the worker expects to be gone, in seconds since the epoch (``None``:
        not preempting, or no deadline given)."""

    def to_dict(self) -> dict[str, Any]:
        """The plain dict (for JSON, Prometheus and callers written against it)."""

    def __getitem__(self, key: str, /) -> Any:
        """``to_dict()[key]``."""

    def get(self, key: str, default: Any = None) -> Any:
        """``to_dict().get(key, default)``."""

    def keys(self) -> list[str]:
        """``to_dict()``'s keys."""

@final
class PsStatus:
    """What a parameter server reports about itself (``PsClient.get_status()``).

    Example: ``PsClient(address).get_status().variables``

    Frozen. ``to_dict()`` gives the plain dict this call returned before it was typed
    (enums as their spellings, nested records as dicts); ``record[key]`` and
    ``record.get(key)`` read that dict, so code written against it keeps working."""

    @property
    def ps_index(self) -> int: ...
    @property
    def jaxcluster_version(self) -> str: ...
    @property
    def protocol_revision(self) -> int: ...
    @property
    def incarnation(self) -> int: ...
    @property
    def variables(self) -> int: ...
    @property
    def variable_bytes(self) -> int: ...
    @property
    def reads(self) -> int: ...
    @property
    def updates(self) -> int: ...
    @property
    def variables_created(self) -> int: ...
    @property
    def unauthenticated_requests(self) -> int: ...
    @property
    def rejected_requests(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def uptime_seconds(self) -> float: ...
    @property
    def connections_open(self) -> int: ...
    @property
    def connections_dropped(self) -> int: ...
    @property
    def bytes_read(self) -> int: ...
    @property
    def bytes_written(self) -> int: ...
    @property
    def state_ttl_seconds(self) -> float:
        """Seconds a vanished session's variables are kept (``--state-ttl``)."""
    @property
    def sessions(self) -> list[SessionHeld]:
        """The sessions holding variables now, by id (``resources`` counts variables,
        optimizer slots and step counts included)."""
    def to_dict(self) -> dict[str, Any]:
        """The plain dict (for JSON, Prometheus and callers written against it)."""

    def __getitem__(self, key: str, /) -> Any:
        """``to_dict()[key]``."""

    def get(self, key: str, default: Any = None) -> Any:
        """``to_dict().get(key, default)``."""

    def keys(self) -> list[str]:
        """``to_dict()``'s keys."""

@final
class Metrics:
    """The coordinator's counters at one moment (``Dispatcher.metrics()``).

    Example: ``metrics.completed + metrics.failed``

    Frozen. ``to_dict()`` gives the plain dict this call returned before it was typed
    (enums as their spellings, nested records as dicts); ``record[key]`` and
    ``record.get(key)`` read that dict, so code written against it keeps working."""

    @property
    def queued(self) -> int: ...
    @property
    def inflight(self) -> int: ...
    @property
    def completed(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def cancelled(self) -> int: ...
    @property
    def retried(self) -> int: ...
    @property
    def worker_failures(self) -> int: ...
    @property
    def ps_failures(self) -> int:
        """Closure runs that failed on an unreachable ps task, retried or not."""

    @property
    def functions_registered(self) -> int:
        """Payloads sent to workers."""

    @property
    def preemptions(self) -> dict[str, int]:
        """Preemption notices workers announced, by source (``'gce'``, ``'aws'``,
        ``'signal'``)."""

    @property
    def kept_values_fetched(self) -> int:
        """Kept values (``keep_result=True``) fetched to this coordinator with
        ``ReadValue`` (``RemoteValue.fetch()``)."""

    @property
    def kept_bytes_fetched(self) -> int:
        """Encoded bytes of those values (pickle plus buffers)."""

    @property
    def workers(self) -> list[WorkerMetrics]: ...
    @property
    def latency(self) -> LatencyHistogram:
        """Schedule-to-result seconds."""

    def to_dict(self) -> dict[str, Any]:
        """The plain dict (for JSON, Prometheus and callers written against it)."""

    def __getitem__(self, key: str, /) -> Any:
        """``to_dict()[key]``."""

    def get(self, key: str, default: Any = None) -> Any:
        """``to_dict().get(key, default)``."""

    def keys(self) -> list[str]:
        """``to_dict()``'s keys."""

@final
class WorkerMetrics:
    """One worker's entry in ``Metrics.workers``.

    Example: ``metrics.workers[0].state == "up"``

    Frozen. ``to_dict()`` gives the plain dict this call returned before it was typed
    (enums as their spellings, nested records as dicts); ``record[key]`` and
    ``record.get(key)`` read that dict, so code written against it keeps working."""

    @property
    def index(self) -> int: ...
    @property
    def address(self) -> str: ...
    @property
    def state(self) -> WorkerState: ...
    @property
    def in_state_seconds(self) -> float: ...
    @property
    def completed(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def retried(self) -> int: ...
    @property
    def failures(self) -> int: ...
    @property
    def last_error(self) -> str | None: ...
    def to_dict(self) -> dict[str, Any]:
        """The plain dict (for JSON, Prometheus and callers written against it)."""

    def __getitem__(self, key: str, /) -> Any:
        """``to_dict()[key]``."""

    def get(self, key: str, default: Any = None) -> Any:
        """``to_dict().get(key, default)``."""

    def keys(self) -> list[str]:
        """``to_dict()``'s keys."""

@final
class SpinSite:
    """One kind of spinning site of this process (``spin_sites()``): the thread in
    ``fetch()``, a worker's executor, or a runtime of one thread (``JAXCLUSTER_SPIN_US``).

    Example: ``{s.site: s.spinning for s in spin_sites()}``

    Frozen. ``to_dict()`` gives the plain dict; ``record[key]`` and ``record.get(key)``
    read it."""

    @property
    def site(self) -> str:
        """``"fetch"``, ``"executor"`` or ``"runtime"``."""

    @property
    def spinning(self) -> bool:
        """Whether it keeps spinning (False: its trials keep parking, or spinning is off)."""

    @property
    def waits_spun(self) -> int: ...
    @property
    def waits_parked(self) -> int:
        """Waits that parked at once (kept or tried), not counting a site resting or off."""

    @property
    def way_changes(self) -> int:
        """Times its trials changed the way it keeps."""

    def to_dict(self) -> dict[str, Any]:
        """The plain dict (for JSON, Prometheus and callers written against it)."""

    def __getitem__(self, key: str, /) -> Any:
        """``to_dict()[key]``."""

    def get(self, key: str, default: Any = None) -> Any:
        """``to_dict().get(key, default)``."""

    def keys(self) -> list[str]:
        """``to_dict()``'s keys."""

@final
class RuntimeLending:
    """Whether this process's runtime lends its work to the threads that wait for it
    (``runtime_lending()``): on a runtime of one thread with spinning on, the thread in
    ``fetch()`` or a worker's executor runs the runtime's tasks and I/O while it spins
    (``JAXCLUSTER_RUNTIME_LEND``).

    Example: ``runtime_lending().lending``

    Frozen. ``to_dict()`` gives the plain dict; ``record[key]`` and ``record.get(key)``
    read it."""

    @property
    def lending(self) -> bool:
        """Whether the runtime lends (False: it has more than one thread, spinning is off,
        or ``JAXCLUSTER_RUNTIME_LEND=0``)."""

    @property
    def lends(self) -> int:
        """Times the runtime's own thread let a waiting thread take the runtime."""

    def to_dict(self) -> dict[str, Any]:
        """The plain dict (for JSON, Prometheus and callers written against it)."""

    def __getitem__(self, key: str, /) -> Any:
        """``to_dict()[key]``."""

    def get(self, key: str, default: Any = None) -> Any:
        """``to_dict().get(key, default)``."""

    def keys(self) -> list[str]:
        """``to_dict()``'s keys."""

def runtime_lending() -> RuntimeLending:
    """Whether this process's runtime lends its work to waiting threads, and how often it
    did."""

def spin_sites() -> list[SpinSite]:
    """This process's spinning sites, in a fixed order (``fetch``, ``executor``,
    ``runtime``), with their counts so far."""

@final
class LatencyHistogram:
    """A latency histogram (``Metrics.latency``, ``WorkerServer.execution_seconds()``).

    Example: ``metrics.latency.p99``

    Frozen. ``to_dict()`` gives the plain dict this call returned before it was typed
    (enums as their spellings, nested records as dicts); ``record[key]`` and
    ``record.get(key)`` read that dict, so code written against it keeps working."""

    @property
    def bounds(self) -> list[float]:
        """Bucket upper bounds, seconds."""

    @property
    def counts(self) -> list[int]:
        """One per bound, then the overflow bucket."""

    @property
    def count(self) -> int: ...
    @property
    def sum(self) -> float: ...
    @property
    def max(self) -> float: ...
    @property
    def p50(self) -> float | None:
        """Bucket upper bound; None before the first observation."""

    @property
    def p99(self) -> float | None: ...
    def to_dict(self) -> dict[str, Any]:
        """The plain dict (for JSON, Prometheus and callers written against it)."""

    def __getitem__(self, key: str, /) -> Any:
        """``to_dict()[key]``."""

    def get(self, key: str, default: Any = None) -> Any:
        """``to_dict().get(key, default)``."""

    def keys(self) -> list[str]:
        """``to_dict()``'s keys."""

def set_exception_builder(builder: Callable[[ClosureError], BaseException]) -> None:
    """Registers how a closure's ``ClosureError`` becomes the exception the dispatcher
    raises (its pending error). ``jaxcluster._native`` registers
    ``jaxcluster.coordinator._errors.build_exception`` on import; the first registration
    stands."""

# --- Buffers (rust/py/buffer.rs) -------------------------------------------------------------

@final
class Buffer:
    """Read-only bytes held by the Rust core, exported through the buffer protocol without a
    copy (``numpy.frombuffer(buf)``, ``memoryview(buf)``, ``bytes(buf)`` copies). Received
    values' buffers are ``Buffer`` objects; passing one back (or a view of it, through
    :meth:`within`) sends it without copying.

    Example::

        buf = Buffer.borrow(b"abc")
        assert bytes(buf) == b"abc" and len(buf) == 3
    """

    @staticmethod
    def borrow(obj: Any) -> Buffer:
        """Wraps ``obj``'s memory without copying; only for memory that never changes while
        referenced (``bytes``, a ``jax.Array``'s host view). ``BufferError`` for an object
        that is not a C-contiguous buffer."""

    def within(self, view: Any) -> Buffer:
        """The part of this buffer ``view`` (e.g. ``numpy.frombuffer(self)[2:]``) covers,
        without copying; ``ValueError`` when ``view`` is not inside this buffer."""

    def __len__(self) -> int: ...
    def __bytes__(self) -> bytes: ...
    def __eq__(self, other: object, /) -> bool: ...

# Anything exporting a C-contiguous buffer: bytes, Buffer, memoryview, bytearray,
# pickle.PickleBuffer, a numpy array.
_BytesLike: TypeAlias = Any

# --- Closure outcomes (rust/py/outcome.rs) ---------------------------------------------------

@final
class EncodedValue:
    """A closure's result as the worker sent it: a pickle (protocol 5) and its out-of-band
    buffers, for ``jaxcluster.wire.decode(value.pickle, value.buffers)``."""

    def __new__(cls, pickle: _BytesLike, buffers: Sequence[_BytesLike] = ...) -> Self: ...
    @property
    def pickle(self) -> bytes: ...
    @property
    def buffers(self) -> list[Buffer]: ...

@final
class ClosureError:
    """Why a closure produced no value: a failure or a cancellation. Made by the dispatcher
    (:meth:`ResultCell.result`), by :class:`WorkerClient` for a worker's structured error,
    or from Python (tests, fakes). ``jaxcluster.coordinator._errors.build_exception(error)``
    turns it into the exception to raise.

    Example::

        error = ClosureError("infrastructure", code="UNAVAILABLE",
                             type_name="UnavailableError", message="worker gone")
        error.kind, error["code"]    # ('infrastructure', 'UNAVAILABLE')
    """

    def __new__(
        cls,
        kind: ErrorKind | Literal["user", "input", "function_load", "infrastructure", "cancelled"],
        *,
        type_name: str,
        message: str,
        module: str = ...,
        traceback: str = ...,
        code: str | None = None,
        exception: bytes | None = None,
        exception_buffers: Sequence[bytes] = ...,
        worker: str = ...,
        ps_task: int | None = None,
        resource_id: int | None = None,
    ) -> Self:
        """``ValueError`` for an unknown ``kind`` or a ``code`` that is not a gRPC code
        name."""

    @property
    def kind(self) -> ErrorKind:
        """``user`` (the function raised; ``function_load``: its payload did not load on
        the worker), ``input`` (a per-worker resource it needed failed), ``infrastructure``
        (with ``code``) or ``cancelled``."""

    @property
    def code(self) -> str | None:
        """The gRPC code name of an infrastructure failure or a cancellation, else None."""

    @property
    def type_name(self) -> str:
        """The exception's ``__qualname__``; for infrastructure failures and cancellations
        the ``jaxcluster.errors`` class of ``code``."""

    @property
    def module(self) -> str:
        """The exception's ``__module__``."""

    @property
    def message(self) -> str: ...
    @property
    def traceback(self) -> str:
        """The formatted remote traceback, or empty."""

    @property
    def exception(self) -> bytes | None:
        """The pickled exception when the worker could pickle it (and it unpickled there)."""

    @property
    def exception_buffers(self) -> list[Buffer]:
        """Out-of-band buffers of :attr:`exception`."""

    @property
    def worker(self) -> str:
        """Address of the worker it happened on (empty for a cancellation)."""

    @property
    def ps_task(self) -> int | None:
        """The parameter-server task of a ps failure, else None."""

    @property
    def resource_id(self) -> int | None:
        """The per-worker resource of an ``input`` error a worker reported, else None."""

    def __getitem__(self, key: str, /) -> Any:
        """The field ``key`` (``KeyError`` for any other), so a :class:`WorkerClient`
        reply reads like the dict the rest of it is."""

# --- Worker protocol (rust/py/worker.rs, rust/py/client.rs) --------------------------------

@final
class SessionHeld:
    """One session's values a worker or parameter server holds (``WorkerReport.sessions``,
    ``PsStatus.sessions``).

    Example: ``sum(s.bytes for s in client.get_status().sessions)``

    Frozen; ``to_dict()`` and ``record[key]`` as for :class:`WorkerReport`."""

    @property
    def id(self) -> str:
        """The session's id (``ClusterCoordinator.session_id``,
        ``ParameterServerStrategy.session_id``); empty for calls that carried none."""

    @property
    def resources(self) -> int:
        """Values held: per-worker datasets, iterators, device state; on a ps, variables
        (optimizer slots and step counts included)."""

    @property
    def bytes(self) -> int:
        """Bytes of their array leaves."""

    @property
    def connections(self) -> int:
        """Connections open now that carried the session (0: vanished; released after
        the worker's ``--state-ttl``)."""

    @property
    def idle_seconds(self) -> float:
        """Seconds since its last call."""

    @property
    def named(self) -> bool:
        """Whether it holds values a later session can re-attach: named state
        (``create_per_worker_state(..., name=...)``), or any ps variable
        (``ParameterServerStrategy(..., reattach=True)``)."""

    def to_dict(self) -> dict[str, Any]:
        """The plain dict."""

    def __getitem__(self, key: str, /) -> Any:
        """``to_dict()[key]``."""

    def get(self, key: str, default: Any = None) -> Any:
        """``to_dict().get(key, default)``."""

    def keys(self) -> list[str]:
        """``to_dict().keys()``."""

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
        device_kind: str = ...,
        tls_cert: bytes | None = None,
        tls_key: bytes | None = None,
        max_connections: int = ...,
        max_streams_per_connection: int = ...,
        handshake_timeout: float = 5.0,
        max_function_bytes: int = ...,
        previous_exit: str = ...,
        python_version: str | None = None,
        slice_index: int | None = None,
        slice_rank: int | None = None,
        slice_size: int | None = None,
        state_ttl: float = 3600.0,
        peer_tls_ca: bytes | None = None,
        peer_tls_domain: str | None = None,
    ) -> Self:
        """Binds ``address`` (port 0 picks a free port) and starts serving.

        ``state_ttl``: seconds a session's values are kept after its last connection
        closed without ``EndSession`` (0: released at once). ``peer_tls_ca`` (PEM) and
        ``peer_tls_domain``: how :meth:`pull_value` verifies other workers (plaintext
        without a CA); the server's own ``auth_token`` is what it sends them.


        Raises ``ValueError`` for a bad setting, including a non-loopback address without
        ``auth_token``, and ``OSError`` when the address cannot be bound. ``devices`` are
        ``(tf_name, device_type)`` pairs reported by ``ListDevices``; ``device_kind`` (e.g.
        ``"TPU v4"``) is reported by ``GetStatus``; ``max_message_bytes`` defaults to 64 MiB.
        At most ``max_connections`` connections are open at once (fewer if the open-file
        limit, first raised to its hard limit, leaves less room; a new one over the bound
        closes the oldest one that has not authenticated), each with at most
        ``max_streams_per_connection`` concurrent calls; a connection that sends no
        authenticated request within ``handshake_timeout`` seconds is closed. Registered
        function payloads are kept up to ``max_function_bytes`` (least recently used
        evicted first). ``previous_exit`` is reported by ``GetStatus``: how the previous
        worker process on this address ended, if its launcher said. ``slice_index``,
        ``slice_rank`` and ``slice_size`` (all three or none; rank below size) say which
        multi-host slice this worker is a host of, reported by ``GetStatus``.
        ``python_version`` (default: this interpreter's ``major.minor.micro``) is the
        Python version ``GetStatus`` reports, which a coordinator checks against its own.
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

    def next_job(
        self, timeout: float | None = None, *, while_draining: bool = False
    ) -> WorkerJob | None:
        """The next job, or ``None`` after ``timeout`` seconds or once the server is
        draining with nothing left (with ``while_draining``, a draining server still waits
        up to ``timeout``: a preempted worker awaiting its coordinators' preemption saves).
        Raises ``RuntimeError`` if the previous job is not answered yet (one job at a
        time)."""

    def begin_shutdown(self) -> bool:
        """Stops taking closures: new and queued ones get ``UNAVAILABLE`` so a coordinator
        retries them elsewhere; the running one finishes. ``False`` if already begun.
        Safe to call from a signal handler."""

    def preempt(self, source: str, deadline: float = 0.0, detail: str = "") -> bool:
        """A preemption notice arrived (``source``: ``'gce'``, ``'aws'``, ``'signal'``;
        ``deadline``: seconds since the epoch, 0 if unknown): the worker reports
        ``preempting`` with it (``GetStatus``, and at once on every open stream), logs it
        and begins shutdown as :meth:`begin_shutdown`. ``False`` if a notice had
        arrived already. Safe to call from a signal handler.

        Example: ``server.preempt("signal", time.time() + 30, "SIGTERM")``"""

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Waits until shutdown has begun and no job is queued or running."""

    def shutdown(self, timeout: float | None = None) -> bool:
        """Begins shutdown, waits up to ``timeout`` for the running job, then stops
        serving. Returns whether it drained in time. Do not call it from the executor
        thread while that thread holds an unanswered job."""

    def status(self) -> WorkerReport:
        """What ``GetStatus`` would answer (as :meth:`WorkerClient.get_status`)."""

    def set_session_held(self, session: str, *, values: int, bytes: int, named: bool) -> None:
        """Records what ``session`` holds (the executor counts it), for ``GetStatus``."""

    def execution_seconds(self) -> LatencyHistogram:
        """How long closures ran on this worker (the executor taking one to its answer),
        as a histogram like ``Dispatcher.metrics().latency``."""

    def next_read(self, timeout: float | None = None) -> ValueRead | None:
        """(Dataflow.) The next ``ReadValue`` call for the reader thread (never queued
        behind closures), or ``None`` after ``timeout`` seconds or once the server stopped
        serving (then :attr:`reads_closed`). Waits with the GIL released.

        Example: ``read = server.next_read(0.5)``"""

    @property
    def reads_closed(self) -> bool:
        """Whether the server stopped serving reads (its reader thread may end)."""

    def pull_value(
        self, holder: str, value_id: int, *, session: str, timeout: float | None = None
    ) -> EncodedValue:
        """(Dataflow.) Reads kept value ``value_id`` of ``session`` from the worker at
        ``holder`` (``host:port``) with this server's token and peer TLS settings, the GIL
        released; counted in ``GetStatus`` (``peer_pulls``, ``peer_bytes_received``).
        Raises the ``jaxcluster.errors`` class of the failure (``NotFoundError`` for a
        value the holder does not hold, ``UnavailableError`` for a holder gone).

        Example: ``server.pull_value("10.0.0.5:8470", 12, session=job.session)``"""

    @property
    def pulls_use_tls(self) -> bool:
        """Whether :meth:`pull_value` verifies peers with TLS."""

@final
class ValueRead:
    """(Dataflow.) One ``ReadValue`` call waiting for its answer; answer it exactly once
    (dropped unanswered, it answers ``INTERNAL``).

    Example::

        read = server.next_read(0.5)
        if read is not None:
            read.reply_status("NOT_FOUND", f"no kept value {read.value_id}")
    """

    @property
    def session(self) -> str:
        """The calling session (empty: anonymous); only its values may be read."""

    @property
    def value_id(self) -> int:
        """The kept value asked for."""

    @property
    def replied(self) -> bool:
        """Whether the read has been answered."""

    def reply_ok(self, value: _BytesLike, buffers: Sequence[_BytesLike] = ...) -> None:
        """Answers with the encoded value (its pickle and out-of-band buffers, as
        :meth:`WorkerJob.reply_ok` takes them); sent in chunks."""

    def reply_status(self, code: str, message: str) -> None:
        """Answers with an RPC error (a gRPC code name other than ``"OK"``)."""

@final
class WorkerJob:
    """One request taken by the executor; answer it exactly once.

    A job dropped without an answer replies ``INTERNAL`` so its caller never hangs.
    """

    @property
    def kind(
        self,
    ) -> Literal["run", "create_resource", "release_resource", "release_session"]: ...
    @property
    def session(self) -> str:
        """The session the request came from (empty: the anonymous session); what it
        creates or uses is that session's."""

    @property
    def name(self) -> str:
        """Named state (``create_resource`` jobs): adopt a live value of this name instead
        of running the function; empty for an ordinary resource."""
    @property
    def closure_id(self) -> int | None:
        """The coordinator's closure id (``run`` jobs)."""

    @property
    def resource_id(self) -> int | None:
        """The resource to create (``create_resource`` jobs)."""

    @property
    def worker_index(self) -> int | None:
        """The coordinator's index for this worker (``run`` and ``create_resource`` jobs a
        coordinator sent): what ``get_current_worker_index()`` returns meanwhile. ``None``
        when the caller sent none (the worker's own ``--index`` then)."""

    @property
    def keep_result_id(self) -> int | None:
        """(Dataflow, ``run`` jobs.) Keep the result here under this id of the job's
        session and answer its ``wire.KeptInfo`` instead; ``None``: send the result."""

    @property
    def resource_ids(self) -> list[int]:
        """The resources to drop (``release_resource`` jobs)."""

    @property
    def function_hash(self) -> bytes | None:
        """SHA-256 of the function payload (``run`` and ``create_resource`` jobs)."""

    @property
    def function_kind(self) -> FunctionKind | None: ...
    @property
    def function_payload(self) -> bytes | None:
        """The registered payload; copied on each access, so read it only on a cache miss."""

    @property
    def args(self) -> bytes | None:
        """The pickled ``(args, kwargs)``, or ``None`` when the request had no arguments."""

    @property
    def buffers(self) -> list[Buffer]:
        """The out-of-band buffers of :attr:`args`, without a copy."""

    @property
    def replied(self) -> bool:
        """Whether the job has been answered."""

    def reply_ok(
        self,
        value: _BytesLike | None = None,
        buffers: Sequence[_BytesLike] = ...,
        *,
        released: int = 0,
        reattached: bool = False,
    ) -> None:
        """Answers success: ``run`` needs the pickled result ``value`` (and its buffers:
        ``bytes`` and ``Buffer`` are sent without a copy, any other bytes-like object is
        copied once); ``create_resource`` takes ``reattached`` (a named value was adopted);
        ``release_resource`` and ``release_session`` take the ``released`` count."""

    def reply_error(
        self,
        kind: ErrorKind | Literal["user", "input", "function_load", "infrastructure"],
        type_name: str,
        module: str,
        message: str,
        traceback: str,
        *,
        exception: _BytesLike | None = None,
        exception_buffers: Sequence[_BytesLike] = ...,
        resource_id: int | None = None,
        ps_task: int | None = None,
    ) -> None:
        """Answers a ``run``/``create_resource`` job with a structured closure error;
        ``ps_task`` names the parameter-server task when the error is a ps failure."""

    def reply_status(self, code: str, message: str) -> None:
        """Answers with an RPC error: ``code`` is a gRPC code name other than ``"OK"``, such
        as ``"INVALID_ARGUMENT"``, ``"NOT_FOUND"``, ``"UNAVAILABLE"`` or ``"INTERNAL"``."""

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
        tls_ca: bytes | None = None,
        tls_domain: str | None = None,
        session: str | None = None,
    ) -> Self:
        """``session``: every call carries it (``jaxcluster-session``); ``None``: the
        anonymous session. ``address`` is ``host:port`` (optionally ``grpc://``).
        ``timeout`` bounds the control calls (status, devices, register, release) unless
        they pass their own (default 30 s); ``max_message_bytes`` defaults to 64 MiB.
        With ``tls_ca`` (PEM CA bytes) it connects over TLS and verifies the worker's
        certificate for ``tls_domain`` or the address's host.

        A call's deadline is sent to the worker, which gives up at it: a queued closure of
        a call that timed out is withdrawn before the worker answers, and the client waits
        up to a tenth of the deadline (5 ms to 1 s) past it for that answer. So from a
        worker that could answer, ``DeadlineExceededError`` means the closure will not
        start; a worker that cannot answer at all fails the call once that grace passed."""

    @property
    def address(self) -> str: ...
    def get_status(self, timeout: float | None = None) -> WorkerReport:
        """``state`` ('serving' | 'draining'), ``worker_index``, ``jaxcluster_version``,
        ``jax_version``, ``platform``, ``functions_registered``, ``closures_run``,
        ``closures_failed``, ``queued``, ``inflight``, ``resources_created``,
        ``resources_released``, ``unauthenticated_requests``, ``rejected_requests``,
        ``pid``, ``uptime_seconds``, ``protocol_revision``, ``incarnation`` (random per
        worker server, never 0: a restart changes it; 0 from a worker before it was
        reported), ``last_error`` (the last closure error, ``Type: message``, or ''),
        ``slice_index``, ``slice_rank``, ``slice_size`` (``None`` for a worker that is not
        a host of a multi-host slice)."""

    def list_devices(self, timeout: float | None = None) -> list[dict[str, str]]:
        """``[{"name": "/job:worker/replica:0/task:0/device:CPU:0", "device_type": "CPU"}]``."""

    def register_function(
        self,
        function_hash: bytes,
        kind: _FunctionKind,
        payload: bytes,
        *,
        timeout: float | None = None,
    ) -> bool:
        """Stores ``payload`` under its 32-byte SHA-256 ``function_hash``; returns whether
        the worker already held it."""

    def run_closure(
        self,
        function_hash: bytes,
        args: _BytesLike | None = None,
        buffers: Sequence[_BytesLike] = ...,
        *,
        closure_id: int = 0,
        timeout: float | None = None,
        worker_index: int | None = None,
        preemption_save: bool = False,
        keep_result_id: int | None = None,
    ) -> dict[str, Any]:
        """Runs a registered function on pickled ``(args, kwargs)``. With
        ``keep_result_id`` the worker keeps the result under that id of this client's
        session and answers its encoded ``wire.KeptInfo`` (read it with :meth:`read_value`). Returns
        ``{"closure_id", "value", "buffers", "error"}``: ``value``/``buffers`` (``Buffer``
        objects) hold the pickled result, or ``error`` is the :class:`ClosureError` the
        worker reported (its ``worker`` is this client's address). ``timeout=None`` waits as
        long as the closure runs. A request above ``max_message_bytes`` goes in chunks
        (protocol revision 4). ``worker_index``: what ``get_current_worker_index()`` says
        in the closure (default: the worker's ``--index``; a slice's rank 0 passes on the
        coordinator's to its peers). ``preemption_save``: a read of this session's
        ``on_preemption="save"`` state that a preempting worker still runs; its answer
        always comes in chunks, whatever its size."""

    def create_resource(
        self,
        resource_id: int,
        function_hash: bytes,
        args: _BytesLike | None = None,
        buffers: Sequence[_BytesLike] = ...,
        *,
        timeout: float | None = None,
        worker_index: int | None = None,
        name: str = ...,
    ) -> dict[str, Any]:
        """Runs a registered function and keeps its result on the worker under
        ``resource_id``. Returns ``{"resource_id", "reattached", "error"}`` (``error`` as
        in :meth:`run_closure`, or None); ``worker_index`` as in :meth:`run_closure`. With
        ``name``, a live value of that name is adopted instead (``reattached`` True, the
        function not run)."""

    def release_resource(self, resource_ids: Sequence[int], *, timeout: float | None = None) -> int:
        """Drops resources on the worker; returns how many it held."""

    def read_value(self, value_id: int, *, timeout: float | None = None) -> EncodedValue:
        """(Dataflow.) The value this client's session kept on the worker under
        ``value_id`` (``run_closure(..., keep_result_id=...)``), encoded as a closure's
        result is; decode it with ``wire.decode(v.pickle, v.buffers)``. Raises
        ``NotFoundError`` when the session holds no such value there."""

    def end_session(self, *, timeout: float | None = None) -> bool:
        """Ends this client's session on the worker: what it created there is released
        at once. Returns whether the worker knew the session."""

# --- Device names (rust/py/device.rs) -------------------------------------------------------

@final
class DeviceSpec:
    """An immutable TF device spec: ``/job:<name>/replica:<int>/task:<int>/device:<TYPE>:<int|*>``.

    Same semantics as TF 2.x's ``tf.DeviceSpec``: every field is optional; ``replica``,
    ``task`` and ``device_index`` accept ints or int-like strings (negative values raise
    ``ValueError``); ``job`` and ``device_type`` become ``str``, with ``"cpu"``/``"gpu"``
    upper-cased. Two specs are equal when their ``to_string()`` is. Setting an attribute
    raises ``AttributeError``; use :meth:`replace` instead.

    Example::

        >>> spec = DeviceSpec.from_string("/task:1/job:worker/gpu:0")
        >>> spec.to_string()
        '/job:worker/task:1/device:GPU:0'
        >>> spec.replace(device_index=3).make_merged_spec(DeviceSpec(replica=0)).to_string()
        '/job:worker/replica:0/task:1/device:GPU:3'
    """

    def __new__(
        cls,
        job: object = None,
        replica: int | str | None = None,
        task: int | str | None = None,
        device_type: object = None,
        device_index: int | str | None = None,
    ) -> DeviceSpec: ...
    @staticmethod
    def from_string(spec: str | None) -> DeviceSpec:
        """Parses ``/job:<name>``, ``/replica:<int>``, ``/task:<int>``,
        ``/device:<TYPE>:<int|*>`` and legacy ``/cpu:0``, ``/gpu:*``, ``/tpu:1`` segments in
        any order (leading ``/`` optional; ``None`` and ``""`` give the empty spec).

        Raises ``ValueError`` naming the bad segment and the input for an unknown attribute,
        a non-integer or negative number, a malformed segment, or two device components.
        """

    def parse_from_string(self, spec: str | None) -> DeviceSpec:
        """Returns ``DeviceSpec.from_string(spec)``; ``self`` is not changed (TF 2.x)."""

    def to_string(self) -> str:
        """The present parts in the order job, replica, task, device (``*`` for no index)."""

    def make_merged_spec(self, dev: DeviceSpec) -> DeviceSpec:
        """A new spec taking each field from ``dev`` when it is set there, else from ``self``."""

    def replace(
        self,
        *,
        job: object = ...,
        replica: int | str | None = ...,
        task: int | str | None = ...,
        device_type: object = ...,
        device_index: int | str | None = ...,
    ) -> DeviceSpec:
        """A new spec with the given fields replaced (``None`` clears a field)."""

    @property
    def job(self) -> str | None: ...
    @property
    def replica(self) -> int | None: ...
    @property
    def task(self) -> int | None: ...
    @property
    def device_type(self) -> str | None: ...
    @property
    def device_index(self) -> int | None: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(
        self,
    ) -> tuple[
        type[DeviceSpec], tuple[str | None, int | None, int | None, str | None, int | None]
    ]: ...

def tpu_device_map(names: Iterable[str]) -> tuple[dict[int, list[int]], int]:
    """Groups TPU device names by host: ``({task: sorted core indices}, total_cores)``.

    ``/job:worker/replica:0/task:3/device:TPU:7`` is core 7 of host 3; CPU, GPU and
    TPU_SYSTEM devices are ignored. Raises ``ValueError`` for a name that does not parse, a
    TPU device without a task or core index, or a core listed twice.

    Example::

        >>> tpu_device_map(["/job:w/task:0/device:TPU:1", "/job:w/task:0/device:TPU:0"])
        ({0: [0, 1]}, 2)
    """

def verify_same_core_count(device_map: Mapping[int, Sized]) -> int:
    """The number of cores every host has (0 for an empty map).

    Raises ``RuntimeError`` naming the hosts and their counts when hosts disagree.

    Example::

        >>> verify_same_core_count({0: [0, 1], 1: [0, 1]})
        2
    """

# --- closure queue (rust/py/queue.rs) ---------------------------------------------------

class _Cancellable(Protocol):
    def mark_cancelled(self) -> None: ...

@final
class ClosureQueue:
    """TF's ``_CoordinatedClosureQueue`` in Rust: a bounded, thread-safe queue of closures.

    Closures are any objects with a ``mark_cancelled()`` method. ``get()`` hands one out and
    counts it *inflight* until the consumer calls exactly one of ``mark_finished()``,
    ``mark_failed(exc)`` or ``put_back(closure)``. The first failure is kept and raised, as
    the very exception object given to ``mark_failed``, by the next ``put``, ``wait`` or
    ``done``: before raising, every queued closure is cancelled (``mark_cancelled()``) and
    the inflight ones are waited for; then the error is cleared and the queue is usable
    again. Every blocking call releases the GIL and stays interruptible with Ctrl-C.

    Per-worker sub-queues: a closure put with ``tag=i`` is only handed to ``get(tag=i)``,
    which prefers it over the global queue; tagged closures are never inflight and never
    waited for.

    Example::

        from jaxcluster.coordinator import ClosureQueue

        queue = ClosureQueue(max_size=1024)
        queue.put(closure)              # blocks while full
        c = queue.get(timeout=1.0)      # None on timeout or after stop()
        try:
            c.run()
        except Exception as e:
            queue.mark_failed(e)        # raised later by put/wait/done
        else:
            queue.mark_finished()
        queue.wait()                    # True once nothing is queued or inflight
    """

    def __new__(cls, max_size: int = 262144) -> ClosureQueue:
        """Creates a queue holding at most ``max_size`` untagged closures (``<= 0``: no bound)."""

    def put(self, closure: _Cancellable, tag: int | None = None) -> None:
        """Queues ``closure``; with ``tag``, on that worker's sub-queue instead.

        Blocks while the queue is full or a ``wait()`` is in progress. If a closure failed
        earlier, ``closure`` is queued and then cancelled with everything else queued, and
        that failure is raised. After ``stop()`` the closure is cancelled and
        ``jaxcluster.errors.CancelledError`` is raised. A tagged put never blocks or raises
        the pending error.
        """

    def get(self, timeout: float | None = None, tag: int | None = None) -> Any:
        """Returns the next closure, or ``None`` after ``timeout`` seconds or once stopped.

        With ``tag``, that worker's sub-queue is served first. An untagged closure counts
        as inflight until ``mark_finished``, ``mark_failed`` or ``put_back``.
        """

    def put_back(self, closure: _Cancellable) -> None:
        """Returns an inflight closure that could not run to the tail of the queue.

        Cancels it instead if a failure is pending or the queue was stopped. Never blocks (the
        queue may exceed ``max_size`` by the closures put back). ``AssertionError`` if
        nothing is inflight.
        """

    def mark_finished(self) -> None:
        """Records that an inflight closure finished. ``AssertionError`` if none is inflight."""

    def mark_failed(self, exc: BaseException) -> None:
        """Records that an inflight closure failed with ``exc``; the first failure wins.

        ``AssertionError`` if none is inflight.
        """

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until nothing is queued or inflight: ``True``, or ``False`` on timeout.

        Raises the pending failure instead (see the class documentation). No ``put`` starts
        while a wait is in progress.
        """

    def done(self) -> bool:
        """Whether nothing is queued or inflight; raises the pending failure if any."""

    def stop(self) -> None:
        """Wakes every blocked ``get`` (which returns ``None``) and ``put`` (which raises
        ``CancelledError``) and cancels every closure still queued. Idempotent."""

    def __len__(self) -> int:
        """Untagged closures queued right now."""

    @property
    def inflight(self) -> int:
        """Untagged closures handed out and not yet finished, failed or put back."""

    @property
    def max_size(self) -> int:
        """The ``max_size`` given to the constructor."""

# --- Dispatcher (rust/py/dispatch.rs) --------------------------------------------------------
# The coordinator's Rust dispatcher: one task per worker, on the runtime's few threads, moves
# closures over gRPC with no GIL on that path. A closure's failure is raised as the exception that
# ``jaxcluster.coordinator._errors.build_exception(closure_error)`` builds from its
# :class:`ClosureError`.

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
        d.register_function(fn_hash, "cloudpickle", payload)
        cell = d.schedule(fn_hash, args_pickle, [], [])
        cell.wait()
        result = cell.result()   # an EncodedValue, or a ClosureError
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
        tls_ca: bytes | None = None,
        heartbeat_timeout: float | None = None,
        max_closure_retries: int | None = None,
        connect_timeout: float | None = None,
        slice_sizes: Sequence[int] = ...,
        python_version: str | None = None,
        jax_version: str | None = None,
        jaxcluster_version: str | None = None,
        session_id: str | None = None,
    ) -> Self:
        """``session_id``: every call to a worker carries it, so what this dispatcher
        creates there is its own (``None``: the anonymous session).

        ``slice_sizes`` (one per address, default all 1): how many hosts the slice whose
        rank 0 each address is must have; a worker reporting another slice size, or a rank
        other than 0, is not used (its link keeps retrying and says why, until the
        recovery bound). ``python_version``, ``jax_version`` and ``jaxcluster_version``
        are this coordinator's own (all ``None``: not checked): a worker of another Python
        minor version or an older JAX minor version is not used in the same way, other
        differences are logged once per worker as a WARNING. ``heartbeat_timeout``,
        ``max_closure_retries`` and ``connect_timeout``: ``None``
        keeps the environment's value (``JAXCLUSTER_HEARTBEAT_TIMEOUT_SEC``,
        ``JAXCLUSTER_MAX_CLOSURE_RETRIES``, ``JAXCLUSTER_CONNECT_TIMEOUT_SEC``) or the
        default (5 s, 3, 60 s); ``float('inf')`` (a negative count) means no bound.
        ``max_queue_size <= 0`` means unbounded. ``error_policy='cancel_all'`` (TF's)
        raises the first closure error from the next :meth:`schedule`, :meth:`join` or
        :meth:`done`, cancelling every queued closure; ``'per_closure'`` keeps each error
        on its own :class:`ResultCell`. ``closure_timeout`` (seconds) bounds one execution:
        on expiry the closure is retried once on another worker, then fails with
        ``DeadlineExceededError`` naming the workers; the timed-out worker gets no new work
        until it reports idle. Raises ``ValueError`` for a bad argument or environment
        variable and ``InvalidArgumentError`` for an address that is not ``HOST:PORT``."""

    def register_function(
        self, hash: bytes, kind: _FunctionKind, payload: bytes, name: str = ""
    ) -> None:
        """Registers a function payload under ``hash``, its 32-byte SHA-256 (checked);
        ``ValueError`` for an unknown ``kind``. Each worker is sent the payload the first
        time a closure there needs it, and again after it restarts. Idempotent. ``name``
        (e.g. the function's ``__qualname__``) is how errors call it; the first wins."""

    def schedule(
        self,
        function_hash: bytes,
        args: bytes,
        buffers: Sequence[_BytesLike],
        resources: Sequence[PerWorkerResource],
        *,
        keep_result_id: int | None = None,
    ) -> ResultCell:
        """With ``keep_result_id`` (from :meth:`new_resource_id`) the worker keeps the
        result under that id and answers only its ``wire.KeptInfo`` (dataflow).
        Queues a closure of a registered function: ``args`` is the pickled
        ``(args, kwargs)`` (empty for none), ``buffers`` its out-of-band buffers
        (``bytes`` and ``Buffer`` sent without a copy, other bytes-like objects copied
        once, so changing them later changes nothing), ``resources`` the per-worker
        resources the arguments refer to (as ``ResourceRef(resource_id)``). Blocks with the
        GIL released while the queue is full.
        Under ``cancel_all`` a pending closure error is raised after queuing, so this
        closure is cancelled with the rest (as TF does). ``ValueError`` for an unknown
        function or a released resource; ``RuntimeError`` after :meth:`shutdown`."""

    def create_resource(
        self, function_hash: bytes, *, rebuild: bool = True, name: str = ""
    ) -> PerWorkerResource:
        """With ``name`` (named state), a worker holding a live value of that name adopts
        it instead of running the function (:meth:`PerWorkerResource.reattached`). Builds a
        per-worker resource: each worker runs the registered function (no
        arguments) and keeps the result, ahead of the closures queued after this call.
        Returns at once; never raises the function's error (a closure using a resource whose
        build failed on its worker fails with ``ClosureInputError``). With ``rebuild`` a
        worker that failed or restarted builds it again when it returns; without, it is
        ``'lost'`` there and closures using it there fail with ``ClosureInputError``
        around an ``AbortedError``."""

    def join(self, timeout: float | None = None) -> bool:
        """Waits until nothing is queued or running: ``True``, or ``False`` when
        ``timeout`` seconds passed first. Raises the pending closure error (after cancelling
        what is queued and waiting for what runs)."""

    def done(self) -> bool:
        """Whether nothing is queued or running; raises the pending closure error."""

    def metrics(self) -> Metrics:
        """A typed ``Metrics`` record (``to_dict()`` for the plain dict): gauges ``queued``,
        ``inflight``; counters ``completed``, ``failed``,
        ``cancelled``, ``retried``, ``worker_failures``, ``ps_failures`` (closure runs that
        failed on an unreachable ps task, retried or not), ``functions_registered`` (payloads
        sent to workers), ``kept_values_fetched`` / ``kept_bytes_fetched`` (kept values read
        here with ``read_value``); ``workers`` (per worker ``index``, ``address``, ``state``
        ``'up'`` | ``'recovering'`` | ``'given_up'`` | ``'removed'``, ``in_state_seconds``,
        ``last_error`` and this dispatcher's counts on it: ``completed``, ``failed``, ``retried``,
        ``failures``); ``latency``: schedule-to-result seconds as a ``LatencyHistogram``
        (``bounds``, ``counts``, ``count``, ``sum``, ``max``, ``p50``, ``p99``; ``counts`` has one
        more entry than ``bounds``, for larger values; quantiles are bucket upper bounds,
        None before the first result)."""

    def worker_statuses(self) -> list[WorkerStatus]:
        """Per worker, a typed ``WorkerStatus`` (``report`` holds its last ``GetStatus``;
        ``to_dict()`` gives the flat dict described here): ``index``, ``address``, ``state``,
        ``in_state_seconds``,
        ``last_error`` (the link's last failure, str or None), this dispatcher's counts on
        it (``completed``, ``failed``, ``retried``, ``failures``) and, once the worker
        answered, the fields of its last ``GetStatus`` (``platform``, ``jax_version``,
        ``pid``, ``incarnation``, ``worker_index``, ``closures_run``...; its own
        ``'serving'``/``'draining'`` as ``serving_state``, its own last closure error as
        ``worker_last_error``), how old that answer is (``status_age_seconds``) and, while
        up, ``uptime_seconds`` carried forward to now."""

    def add_workers(self, addresses: list[str], *, slice_size: int = 1) -> list[int]:
        """Adds workers while closures run; returns their indices (the next free ones:
        indices are never reused). Returns at once: each connects in the background, builds
        every live per-worker resource, then takes closures. With ``slice_size`` K > 1 each
        address is the rank-0 host of a slice of K hosts, used only once it reports so.
        ``InvalidArgumentError`` for an address that is not ``HOST:PORT``, ``ValueError``
        for ``slice_size=0``; ``RuntimeError`` after :meth:`shutdown`."""

    def remove_workers(self, indices: list[int]) -> None:
        """Removes workers and returns once each has left (GIL released): it takes no new
        closure, what it runs and has queued finishes (a closure whose result does not
        arrive runs elsewhere), its per-worker resources are released there, and its state
        becomes ``removed``. ``ValueError`` (nothing removed) for an unknown or removed
        index, or when no worker able to run closures would remain. The wait is
        interruptible (Ctrl-C raises ``KeyboardInterrupt``; the workers still leave)."""

    def refresh_statuses(self, max_age: float = 1.0, timeout: float = 1.0) -> int:
        """Asks every ``up`` worker whose last ``GetStatus`` is older than ``max_age``
        seconds for a new one, all at once, each bounded by ``timeout``; returns how many
        answered. Releases the GIL; interruptible (the probes then end in the background)."""

    # --- one worker: the worker table and work aimed at one worker ---

    def schedule_on(
        self,
        worker: int,
        function_hash: bytes,
        args: bytes,
        buffers: Sequence[_BytesLike],
        resources: Sequence[PerWorkerResource],
        *,
        keep_result_id: int | None = None,
    ) -> ResultCell:
        """Queues a closure of a registered function for worker ``worker`` alone; returns
        its cell at once. It runs after what was queued for that worker before (e.g. a
        per-worker resource's build), is not counted by :meth:`join`/:meth:`done`, and its
        error cancels nothing. A worker that fails while running it runs it again once it
        is back (its resources rebuilt first); a worker removed or given up fails it with
        an ``ABORTED`` error naming the worker. ``InvalidArgumentError`` for an unknown
        index.

        Example::

            cell = dispatcher.schedule_on(0, read_hash, pickled, [], [resource])
            cell.wait(timeout=10.0)
        """

    # --- dataflow: kept results ---

    def new_resource_id(self) -> int:
        """A fresh id from the counter per-worker resources use: what a kept result is
        stored under on its worker (one id space with the session's resources)."""

    def release_value(self, worker: int, value_id: int) -> None:
        """Asks worker ``worker`` to drop kept value ``value_id`` (queued behind what is
        queued for that worker; nothing is sent to a worker out of service)."""

    def read_value(
        self, worker: int, value_id: int, *, timeout: float | None = None
    ) -> EncodedValue:
        """Reads kept value ``value_id`` from worker ``worker`` with ``ReadValue`` (in this
        dispatcher's session, with its token and TLS settings; the GIL released while it
        waits), counted in ``metrics().kept_values_fetched`` / ``kept_bytes_fetched``.
        Raises ``NotFoundError`` when the worker does not hold it (released, or the worker
        restarted), ``UnavailableError`` when it cannot be reached.

        Example::

            encoded = dispatcher.read_value(0, value_id, timeout=60.0)
            value = wire.decode(encoded.pickle, encoded.buffers)
        """

    def worker_free(self, worker: int) -> bool:
        """Whether worker ``worker`` is up, not preempting, and has nothing outstanding or
        queued for it alone (dataflow places a consumer on its input's worker only then)."""

    def failure_pending(self) -> bool:
        """Whether a closure error is pending under ``cancel_all`` (not raised yet)."""

    def watch_preemptions(self, watch: CellWatch) -> None:
        """Wakes ``watch`` (its ``wait`` returns ``[]``) each time a worker's preemption
        notice is acted on from now on; the worker's status shows the notice by then.

        Example::

            watch = core.CellWatch()
            dispatcher.watch_preemptions(watch)
            watch.wait(None)  # returns once some worker announced its preemption
        """

    def wait_reported(self, timeout: float | None = None) -> bool:
        """Waits (GIL released, interruptibly) until some worker not removed has reported
        its status (platform, devices); ``False`` if ``timeout`` seconds passed first."""

    def worker_addresses(self) -> list[str]:
        """Every worker's address, by index (removed workers included)."""

    def is_removed(self, index: int) -> bool:
        """Whether worker ``index`` was removed (or is being removed)."""

    def active_workers(self) -> list[tuple[str, int]]:
        """``(address, index)`` of every worker not removed, by index."""

    def given_up_workers(self) -> list[str]:
        """Addresses of the workers (not removed) whose link gave up reconnecting."""

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

    def result(self) -> EncodedValue | ClosureError:
        """The closure's value, or the :class:`ClosureError` of its failure or
        cancellation (``kind`` ``'user'``, ``'input'``, ``'infrastructure'`` or
        ``'cancelled'``). ``RuntimeError`` while NOT_READY."""

    @property
    def worker(self) -> int | None:
        """The index of the worker whose answer settled the cell with a value (where a
        kept result lives), or ``None`` (not ended, cancelled, or failed)."""

    def watch(self, watch: CellWatch) -> None:
        """Has ``watch`` told this cell's ``closure_id`` when it settles (at once if it
        has)."""

@final
class CellWatch:
    """One waiter told when any of many :class:`ResultCell` s settles (dataflow's
    dependency tracker sleeps on it instead of a thread per producer).

    Example::

        watch = CellWatch()
        cell.watch(watch)
        settled_ids = watch.wait(timeout=1.0)   # [cell.closure_id] once it ended
    """

    def __init__(self) -> None: ...
    def wait(self, timeout: float | None = None) -> list[int]:
        """Waits (GIL released, Ctrl-C interruptible) until a watched cell settled,
        :meth:`wake` was called or ``timeout`` seconds passed; returns the closure ids
        settled since the last wait (empty when woken or timed out)."""

    def wake(self) -> None:
        """Makes the current or next :meth:`wait` return at once."""

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

    def state(self, worker: int) -> ResourceState:
        """The resource's state on ``worker`` (``IndexError`` when out of range); aborted
        when lost with its worker (rebuilt when it returns) or released; lost when lost
        with its worker and created with ``rebuild=False``."""

    def reattached(self, worker: int) -> bool:
        """Whether ``worker``'s value was a live named value adopted, not built."""

    def set_build_args(
        self, worker: int, args: _BytesLike, buffers: Sequence[_BytesLike] = ...
    ) -> None:
        """Makes the next build on ``worker`` call the function with these pickled
        ``(args, kwargs)`` (and out-of-band ``buffers``) instead of none: a preempted
        worker's replacement starts from the saved copy of its state. Dropped once a build
        with them succeeded there. ``IndexError`` for a worker out of range."""

    def has_build_args(self, worker: int) -> bool:
        """Whether ``worker``'s next build still has arguments of :meth:`set_build_args`."""

    def release(self) -> None:
        """Releases it on every worker now; later schedules with it raise ``ValueError``.
        Idempotent."""

# --- Parameter servers (rust/py/ps.rs) -------------------------------------------------------
# Values go in as anything numpy.asarray accepts (numpy and JAX arrays, numbers,
# lists) of dtype float16, bfloat16 (ml_dtypes), float32, float64, int8..int64 or
# uint8..uint64, and come back as new writable numpy arrays. Errors as above; a value of
# another dtype or shape than its variable -> InvalidArgumentError naming both; an unknown
# variable -> NotFoundError; an unsupported dtype -> TypeError before any RPC.

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
        tls_cert: bytes | None = None,
        tls_key: bytes | None = None,
        max_connections: int = ...,
        max_streams_per_connection: int = ...,
        handshake_timeout: float = 5.0,
        state_ttl: float = 3600.0,
    ) -> Self:
        """Binds ``address`` (port 0 picks a free port) and starts serving. Raises
        ``ValueError`` for a bad setting, including a non-loopback address without
        ``auth_token`` or a negative ``index``, and ``OSError`` when the address cannot be
        bound. ``max_message_bytes`` defaults to 64 MiB; ``max_connections``,
        ``max_streams_per_connection`` and ``handshake_timeout`` bound connections as for
        :class:`WorkerServer`. A session whose connections all closed without ending it
        keeps its variables ``state_ttl`` seconds (0: released as its last one closes)."""

    @property
    def address(self) -> str:
        """``host:port`` actually bound."""

    @property
    def port(self) -> int:
        """The port actually bound."""

    @property
    def index(self) -> int:
        """This task's index in the ``ps`` job."""

    def status(self) -> PsStatus:
        """The same dict as :meth:`PsClient.get_status`."""

    def shutdown(self) -> None:
        """Stops accepting connections and lets in-flight requests finish (up to 5 s).
        Idempotent."""

@final
class OptimizerSpec:
    """An optimizer's rule (``"sgd"``, ``"adam"``, ``"adamw"``, ``"rmsprop"``,
    ``"adagrad"``), hyperparameters and learning-rate schedule (``"constant"``,
    ``"exponential_decay"``, ``"cosine_decay"``, ``"piecewise_constant"``), checked when
    made. Made by :mod:`jaxcluster.strategy.optimizers`."""

    def __new__(
        cls,
        kind_name: str,
        *,
        schedule: str = "constant",
        initial: float = 0.0,
        decay_steps: int = 0,
        decay_rate: float = 0.0,
        staircase: bool = False,
        alpha: float = 0.0,
        boundaries: list[int] = ...,
        values: list[float] = ...,
        momentum: float = 0.0,
        nesterov: bool = False,
        beta_1: float = 0.0,
        beta_2: float = 0.0,
        epsilon: float = 0.0,
        weight_decay: float = 0.0,
        rho: float = 0.0,
        centered: bool = False,
        initial_accumulator_value: float = 0.0,
        amsgrad: bool = False,
    ) -> OptimizerSpec: ...
    def slots(self) -> list[tuple[str, float]]:
        """The slots the ps keeps beside each variable, with their starting values."""

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
        tls_ca: bytes | None = None,
        tls_domain: str | None = None,
        session: str | None = None,
    ) -> Self:
        """``address`` is ``host:port`` (optionally ``grpc://``). ``timeout`` bounds each
        call unless it passes its own (default 30 s; ``None``: no limit). With ``tls_ca``
        (PEM CA bytes) it connects over TLS, verifying ``tls_domain`` or the address's host.
        Every call belongs to ``session`` (1-64 letters, digits, ``-``, ``_``; ``None``: the
        anonymous session) and sees only that session's variables."""

    @property
    def address(self) -> str: ...
    def get_status(self, *, timeout: float | None = None) -> PsStatus:
        """``ps_index``, ``jaxcluster_version``, ``protocol_revision``, ``incarnation``
        (random per process: changes when the ps restarts), ``variables``,
        ``variable_bytes``, ``reads``, ``updates``, ``variables_created``,
        ``unauthenticated_requests``, ``rejected_requests``, ``pid``, ``uptime_seconds``,
        ``bytes_read`` (tensor bytes sent in answers), ``bytes_written`` (tensor bytes
        received in updates and new variables)."""

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

    def apply_update(
        self,
        name: str,
        slot_prefix: str,
        spec: OptimizerSpec,
        gradient: Any,
        *,
        gradient_scale: float = 0.0,
        read_value: bool = False,
        timeout: float | None = None,
        borrow: bool = False,
    ) -> int | np.ndarray:
        """One optimizer step on ``name`` from ``gradient`` (its shape; its dtype, bfloat16,
        or int8 with ``gradient_scale``: the gradient is ``int8 * gradient_scale``), applied
        atomically on the ps with the slots ``name/slot_prefix/<slot>`` and the step count
        ``name/slot_prefix/iterations`` (created on first use). Returns as :meth:`assign`.
        ``borrow``: send the gradient's own memory instead of a copy, and return only once
        nothing reads it any more (after an answer, a deadline or an interrupt alike), as a
        blocking socket send does; another thread must not write it meanwhile."""

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

    def end_session(self, *, timeout: float | None = None) -> int:
        """Ends this client's session on the ps: its variables are released at once.
        Returns how many were released."""

    def reattach(
        self, name: str, dtype: str, shape: Sequence[int], *, timeout: float | None = None
    ) -> list[str] | None:
        """Adopts into this client's session a live variable ``name`` of ``dtype`` and
        ``shape`` that another session holds, with its optimizer slots and step counts
        (the other session loses them). ``None`` when no session holds it, else the slot
        names that came along; another dtype or shape raises ``FailedPreconditionError``.

        Example: ``client.reattach("w", "float32", [4])``"""
