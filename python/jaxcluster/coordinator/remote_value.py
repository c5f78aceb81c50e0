"""RemoteValue: the eventual result of a scheduled closure."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from typing import Any

from jaxcluster import errors, wire
from jaxcluster._native import core
from jaxcluster.coordinator import _encoding
from jaxcluster.coordinator._errors import add_note, build_exception

__all__ = ["RemoteValue", "RemoteValueStatus"]

ClosureError = core.ClosureError

_NOT_READY, _ABORTED, _READY = 0, 1, 2
_UNSET: Any = object()


class RemoteValueStatus(enum.Enum):
    """Where a :class:`RemoteValue` stands (TF's names and values).

    ``READY`` covers both a value and an error; ``ABORTED`` means the closure was cancelled.
    """

    NOT_READY = "NOT_READY"
    ABORTED = "ABORTED"
    READY = "READY"


_STATUSES = (RemoteValueStatus.NOT_READY, RemoteValueStatus.ABORTED, RemoteValueStatus.READY)


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"timeout={timeout!r}; expected None or a number of seconds >= 0")
    return float(timeout)


class RemoteValue:
    """The result of a closure scheduled with ``ClusterCoordinator.schedule``.

    The result is decoded once, on the first ``fetch``, and kept. A closure that failed
    raises its error from every ``fetch``; a cancelled one raises
    :class:`~jaxcluster.errors.CancelledError`.

    Example::

        rv = coordinator.schedule(lambda x: x + 1, args=(41,))
        rv.fetch()                   # 42, once a worker has run it
        rv.status                    # RemoteValueStatus.READY
    """

    __slots__ = (
        "__weakref__",
        "_cell",
        "_coordinator",
        "_error",
        "_generation",
        "_lock",
        "_name",
        "_node",
        "_origin",
        "_value",
    )

    def __init__(
        self,
        cell: Any,
        coordinator: Callable[[], Any] | None = None,
        origin: str = "",
        node: Any = None,
        name: str = "",
    ) -> None:
        self._cell = cell
        # A weak reference to the coordinator (called, it gives the coordinator or None),
        # asked why a result is late.
        self._coordinator = coordinator
        # Where an exported function was defined: its remote traceback cannot say.
        self._origin = origin
        self._lock = threading.Lock()
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        # Dataflow (coordinator/dataflow.py): the closure's node, when it keeps its result
        # or takes other results; its cell is then a TrackedCell, re-made by lineage
        # (each re-make a new generation, so what was decoded is decoded again).
        self._node = node
        self._generation = 0
        # The function's name, for errors naming this closure as a failed input.
        self._name = name

    @property
    def status(self) -> RemoteValueStatus:
        """``NOT_READY``, ``ABORTED`` (cancelled) or ``READY`` (a value or an error)."""
        return _STATUSES[self._cell.status]

    def done(self) -> bool:
        """Whether the closure has ended (with a value, an error or a cancellation)."""
        return self._cell.status != _NOT_READY

    def fetch(self, timeout: float | None = None) -> Any:
        """Waits for the closure and returns its result (numpy arrays for JAX arrays).

        Raises the closure's error if it failed, ``CancelledError`` if it was cancelled, and
        ``DeadlineExceededError`` if it has not ended within ``timeout`` seconds (the
        closure keeps running; fetch again later).
        """
        if self._node is not None and self._node.keep:
            return self._fetch_kept(timeout)
        self._refresh()
        if self._value is _UNSET and self._error is None:
            seconds = _check_timeout(timeout)
            if not self._cell.wait(seconds):
                raise errors.DeadlineExceededError(
                    f"the closure's result was not ready within timeout={timeout!r} seconds "
                    f"(status {self.status.value}); {self._waiting_hint()}"
                )
            self._settle()
        if self._error is not None:
            raise self._error
        return self._value

    # --- dataflow: results kept on a worker ------------------------------------------

    @property
    def kept(self) -> bool:
        """Whether the result stays on its worker (``schedule(..., keep_result=True)``)."""
        return self._node is not None and bool(self._node.keep)

    @property
    def worker(self) -> int | None:
        """The index of the worker that produced the value (for a kept value: holds it),
        or ``None`` until the closure ended with a value.

        Example::

            rv = coordinator.schedule(make_batch, keep_result=True)
            rv.fetch(); rv.worker        # e.g. 1
        """
        return self._cell.worker  # type: ignore[no-any-return]

    @property
    def spec(self) -> Any:
        """A kept value's pytree with every array leaf a ``jax.ShapeDtypeStruct`` (waits
        for the closure; raises its error); ``None`` for a value that came back.

        Example::

            rv = coordinator.schedule(lambda: jnp.zeros((4, 3)), keep_result=True)
            rv.spec                      # ShapeDtypeStruct(shape=(4, 3), dtype=float32)
        """
        return self._kept_info().spec if self.kept else None

    @property
    def nbytes(self) -> int | None:
        """Bytes of a kept value's arrays (waits; raises the closure's error); ``None`` for
        a value that came back."""
        return int(self._kept_info().nbytes) if self.kept else None

    def _kept_info(self) -> Any:
        """The ``wire.KeptInfo`` the holder answered (waits for the closure)."""
        self._refresh()
        if self._value is _UNSET and self._error is None:
            self._cell.wait(None)
            self._settle()
        if self._error is not None:
            raise self._error
        return self._value

    def _error_only(self) -> None:
        """Raises the closure's error, if it failed (the closure has ended)."""
        self._refresh()
        self._settle()
        if self._error is not None:
            raise self._error

    def _refresh(self) -> None:
        """Forgets what was decoded when lineage re-made the value since."""
        generation = getattr(self._cell, "generation", 0)
        if generation != self._generation:
            with self._lock:
                self._value, self._error, self._generation = _UNSET, None, generation

    def _fetch_kept(self, timeout: float | None) -> Any:
        """Pulls a kept value from its holder (re-made first if the holder is gone)."""
        seconds = _check_timeout(timeout)
        if not self._cell.wait(seconds):
            raise errors.DeadlineExceededError(
                f"the closure's result was not ready within timeout={timeout!r} seconds "
                f"(status {self.status.value}); {self._waiting_hint()}"
            )
        coordinator = None if self._coordinator is None else self._coordinator()
        if coordinator is None:
            raise RuntimeError(
                "this kept value's ClusterCoordinator is gone: the value went with its session"
            )
        return coordinator._pull(self, seconds)

    def _wait(self, timeout: float | None) -> bool:
        """Waits up to ``timeout`` seconds for the closure to end; whether it did."""
        return bool(self._cell.wait(timeout))

    def _waiting_hint(self) -> str:
        coordinator = None if self._coordinator is None else self._coordinator()
        if coordinator is None:
            return "it is still queued or running — fetch again, or call join() first"
        return str(coordinator._waiting_hint())

    def get(self) -> Any:
        """Same as :meth:`fetch` with no timeout (TF's ``RemoteValue.get``)."""
        return self.fetch()

    def _settle(self) -> None:
        with self._lock:
            if self._value is not _UNSET or self._error is not None:
                return
            result = self._cell.result()
            if isinstance(result, BaseException):  # dataflow: an input's error
                self._error = result
            elif isinstance(result, ClosureError):
                self._error = build_exception(result)
                if self._origin and result.kind in (
                    core.ErrorKind.USER,
                    core.ErrorKind.FUNCTION_LOAD,
                ):
                    add_note(
                        self._error,
                        "The function ran on the worker as a jax.export of:\n" + self._origin,
                    )
            else:
                try:
                    self._value = wire.decode(result.pickle, result.buffers)
                except Exception as exc:
                    self._error = errors.InternalError(
                        f"the closure's result arrived but could not be unpickled here: "
                        f"{type(exc).__name__}: {exc}"
                    )
                    self._error.__cause__ = exc

    def __reduce_ex__(self, protocol: Any) -> Any:
        _encoding.reject_remote_value(self)
        raise TypeError(
            "a RemoteValue cannot be pickled: it stands for a result that lives in this "
            "process; fetch() it and pass the value instead"
        )

    def __repr__(self) -> str:
        return f"<RemoteValue {self.status.value}>"
