"""Kept results on the worker (dataflow, SPEC §12): what is answered instead of a kept
value, how a closure's :class:`~jaxcluster.wire.KeptRef` arguments become values, and the
reader thread that serves other workers' ``ReadValue`` calls.

A closure run with ``keep_result_id`` leaves its result in the executor's
``ResourceRegistry`` under (session, id), as a live object (JAX arrays stay on their
device), and answers :func:`kept_info`: its bytes and its spec. A later closure's
``KeptRef(value_id, holder)`` resolves to that object when this worker holds it (no bytes
move), else to the value pulled from ``holder`` (``WorkerServer.pull_value``: Rust, the GIL
released, the worker's token and TLS settings), in which a leaf that was a ``jax.Array``
on the holder is one again, on this worker's default device (``wire.device_arrays``): a
closure gets the same kind of value wherever it runs. A pull that fails is an input error
(``ResourceInputError`` with ``resource_id = value_id``) naming the holder and why, which
the coordinator takes as "re-make the value".

Reads are served by :class:`ValueReader`, a second Python thread, not by the executor:
the executor may be running a long closure, and a peer's read must not wait for it. The
reader waits in ``WorkerServer.next_read`` with the GIL released and holds the GIL only to
look the value up and pickle it (``wire.encode(..., zero_copy=True)``: a host array's
memory is lent to the Rust server, not copied; a device array is copied to the host only
now, when someone reads it). The registry's dicts are read with single lookups, which the
GIL makes atomic, so the reader needs no lock beside the executor.

Example::

    info = kept_info({"w": numpy.zeros((2, 3), "float32")})
    info.nbytes  # 24; info.spec["w"] is jax.ShapeDtypeStruct((2, 3), float32)
"""

from __future__ import annotations

import logging
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

from jaxcluster import wire
from jaxcluster.worker.resources import ResourceInputError, ResourceRegistry

__all__ = ["SMALL_LEAF_BYTES", "KeptInputs", "ValueReader", "kept_info", "lend"]

_log = logging.getLogger("jaxcluster.worker")

#: A non-array leaf pickled to at most this many bytes is kept as it is in a spec.
SMALL_LEAF_BYTES = 1024

#: How long a pull waits for its holder by default (a large value moves in this time).
PULL_TIMEOUT_SECONDS = 600.0


def _jax() -> Any:
    """JAX if it can be imported here (a worker normally has it loaded already)."""
    jax = sys.modules.get("jax")
    if jax is not None:
        return jax
    try:
        import jax
    except ImportError:
        return None
    return jax


def _is_array(leaf: Any) -> bool:
    return (
        not isinstance(leaf, type)
        and hasattr(leaf, "shape")
        and hasattr(leaf, "dtype")
        and isinstance(getattr(leaf, "nbytes", None), int)
    )


def _leaf_spec(leaf: Any, jax: Any) -> Any:
    if _is_array(leaf):
        shape = tuple(int(n) for n in leaf.shape)
        if jax is not None:
            return jax.ShapeDtypeStruct(shape, leaf.dtype)
        import numpy as np

        return wire.ArraySpec(shape, np.dtype(leaf.dtype).str)
    try:
        size = len(pickle.dumps(leaf, protocol=wire.PICKLE_PROTOCOL))
    except Exception:
        return wire.OmittedLeaf(type(leaf).__qualname__, -1)
    return leaf if size <= SMALL_LEAF_BYTES else wire.OmittedLeaf(type(leaf).__qualname__, size)


def _map_plain(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value``'s dicts, lists and tuples rebuilt with ``leaf`` applied to the rest."""
    if isinstance(value, dict):
        return {k: _map_plain(v, leaf) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_map_plain(v, leaf) for v in value)
    return leaf(value)


def kept_info(value: Any) -> wire.KeptInfo:
    """What a worker answers for a kept ``value``: bytes of its array leaves, and its
    pytree with each array as ``jax.ShapeDtypeStruct`` (``wire.ArraySpec`` without JAX),
    small other leaves as they are, large ones as ``wire.OmittedLeaf``."""
    jax = _jax()
    total = 0

    def leaf(item: Any) -> Any:
        nonlocal total
        if _is_array(item):
            total += int(item.nbytes)
        return _leaf_spec(item, jax)

    spec = jax.tree_util.tree_map(leaf, value) if jax is not None else _map_plain(value, leaf)
    return wire.KeptInfo(nbytes=total, spec=spec)


def _lent_array(leaf: Any) -> Any:
    numpy = sys.modules.get("numpy")
    if numpy is None or type(leaf) is not numpy.ndarray:
        return leaf
    dtype = leaf.dtype
    if not (dtype.kind in "biufc" and dtype.fields is None and leaf.flags.c_contiguous):
        return leaf
    if not leaf.size:
        return leaf
    from jaxcluster._native import core

    return numpy.frombuffer(core.Buffer.borrow(leaf), dtype=dtype).reshape(leaf.shape)


def lend(value: Any) -> Any:
    """``value`` as it is kept: each plain numpy array becomes a read-only view of the same
    memory (no copy) that ``wire.encode(..., zero_copy=True)`` lends to the server instead
    of copying. A kept value is immutable, as Ray's object store makes its arrays: a read
    can then never see it change half-way, and a 64 MiB read no longer begins with a
    64 MiB copy on the holder (measured: 146 -> 59 ms, below one TCP echo of it)."""
    jax = _jax()
    if jax is not None:
        return jax.tree_util.tree_map(_lent_array, value)
    return _map_plain(value, _lent_array)


class KeptInputs:
    """Resolves the :class:`~jaxcluster.wire.KeptRef` arguments of the executor's jobs:
    this worker's own kept value, else one pulled from its holder.

    ``unreachable`` (a sentence) makes every pull fail with it, e.g. a worker serving TLS
    that has no CA for its peers.

    Example::

        inputs = KeptInputs(server, registry, worker_index=0)
        wire.decode(data, buffers, resolve_kept=inputs.resolver(session))
    """

    def __init__(
        self,
        server: Any,
        registry: ResourceRegistry,
        worker_index: int,
        *,
        unreachable: str | None = None,
        timeout: float = PULL_TIMEOUT_SECONDS,
    ) -> None:
        self._server = server
        self._registry = registry
        self._index = worker_index
        self._unreachable = unreachable
        self._timeout = timeout

    def resolver(self, session: str) -> Callable[[int, str], Any]:
        """A ``resolve_kept`` for one job of ``session``: each value resolved once even
        when the arguments name it twice."""
        seen: dict[int, Any] = {}

        def resolve(value_id: int, holder: str) -> Any:
            if value_id not in seen:
                found, value = self._registry.kept(session, value_id)
                seen[value_id] = value if found else self._pull(session, value_id, holder)
            return seen[value_id]

        return resolve

    def _pull(self, session: str, value_id: int, holder: str) -> Any:
        from jaxcluster import errors

        try:
            if self._unreachable is not None:
                raise errors.UnavailableError(self._unreachable)
            encoded = self._server.pull_value(
                holder, value_id, session=session, timeout=self._timeout
            )
            # A jax.Array on its holder is one here too (on this worker's default device),
            # as when the closure runs on the holder.
            with wire.device_arrays():
                return wire.decode(encoded.pickle, encoded.buffers)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            message = (
                f"worker {self._index} could not read kept value {value_id} from its "
                f"holder {holder}: {why}"
            )
            kind = type(exc) if type(exc) in _PLAIN_ERRORS else errors.UnavailableError
            raise ResourceInputError(value_id, kind(message)) from None


def _plain_errors() -> tuple[type, ...]:
    from jaxcluster import errors

    return (
        errors.NotFoundError,
        errors.UnavailableError,
        errors.DeadlineExceededError,
        errors.UnauthenticatedError,
        errors.ResourceExhaustedError,
        errors.InvalidArgumentError,
        errors.InternalError,
    )


_PLAIN_ERRORS = _plain_errors()


class ValueReader:
    """The worker's second Python thread: answers ``ReadValue`` calls from ``registry``
    while the executor runs closures (see the module docstring).

    Example::

        reader = ValueReader(server, registry, worker_index=0)
        reader.start()  # a daemon; ends once the server stops serving
    """

    def __init__(self, server: Any, registry: ResourceRegistry, worker_index: int) -> None:
        self._server = server
        self._registry = registry
        self._index = worker_index
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, name=f"jaxcluster-worker-{worker_index}-reads", daemon=True
        )

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called."""
        return self._thread.ident is not None

    def start(self) -> None:
        """Starts serving reads."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stops serving reads (queued ones stay for the server to refuse) and joins."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _serve(self) -> None:
        while not self._stop.is_set():
            read = self._server.next_read(0.5)
            if read is None:
                if self._server.reads_closed:
                    return
                continue
            try:
                self.answer(read)
            except BaseException as exc:  # answer it whatever happens; keep serving
                if not read.replied:
                    read.reply_status("INTERNAL", f"{type(exc).__name__}: {exc}")
                if not isinstance(exc, Exception):
                    raise

    def answer(self, read: Any) -> None:
        """Answers one read: the encoded value, or ``NOT_FOUND``."""
        found, value = self._registry.kept(read.session, read.value_id)
        if not found:
            label = f"session {read.session}" if read.session else "the anonymous session"
            read.reply_status(
                "NOT_FOUND",
                f"worker {self._index} holds no kept value {read.value_id} for {label}: it "
                "was never kept here by this session, was released, or the worker restarted "
                "since",
            )
            return
        try:
            encoded = wire.encode(value, zero_copy=True, mark_device_arrays=True)
        except Exception as exc:
            read.reply_status(
                "FAILED_PRECONDITION",
                f"worker {self._index} could not encode kept value {read.value_id}: "
                f"{type(exc).__name__}: {exc}",
            )
            return
        read.reply_ok(encoded.pickle, encoded.buffers)
