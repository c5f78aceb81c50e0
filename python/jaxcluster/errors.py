"""Exceptions raised by jaxcluster.

The gRPC-status-shaped classes mirror TensorFlow's ``tf.errors`` names so code that catches
``tf.errors.UnavailableError`` ports by changing the import. Every class derives from
:class:`JaxClusterError`; where a builtin has the same meaning the class derives from it too
(``DeadlineExceededError`` is a ``TimeoutError``), so generic handlers keep working.

Example::

    from jaxcluster import errors
    try:
        rv.fetch(timeout=1.0)
    except errors.DeadlineExceededError:
        ...  # the closure keeps running; fetch again later
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AbortedError",
    "CancelledError",
    "ClosureAbortedError",
    "ClosureInputError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "JaxClusterError",
    "MissingExtraError",
    "NotFoundError",
    "OutOfRangeError",
    "PSUnavailableError",
    "RemoteError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
]


class JaxClusterError(Exception):
    """Base class of every exception jaxcluster defines."""


class CancelledError(JaxClusterError):
    """The operation was cancelled, e.g. a queued closure after an earlier closure failed."""


class UnavailableError(JaxClusterError, ConnectionError):
    """A worker or service could not be reached (gRPC ``UNAVAILABLE``)."""


class PSUnavailableError(UnavailableError):
    """A parameter-server task could not be reached, or restarted and lost its variables.

    ``task_type`` is ``"ps"``, ``task_id`` the ps task's index and ``address`` its
    ``host:port`` (each ``None`` when not known); ``original_exception`` is the error that
    revealed the failure, as on TF's class of this name; ``detail`` says what happened
    (default: ``str(original_exception)``). The error pickles with all of them, so one
    raised inside a closure on a worker reaches the coordinator intact. A message alone,
    ``PSUnavailableError("...")``, is accepted too, as for every class here.

    Example::

        error = PSUnavailableError(1, "10.0.0.2:2222", ConnectionRefusedError("refused"))
        str(error)      # 'parameter server task 1 (10.0.0.2:2222) is unavailable: refused'
        error.task_id   # 1
    """

    def __init__(
        self,
        task_id: int | str | None = None,
        address: str | None = None,
        original_exception: BaseException | None = None,
        detail: str | None = None,
    ) -> None:
        if isinstance(task_id, str) and address is None and detail is None:
            task_id, detail = None, task_id  # the message-only form
        if task_id is not None and (isinstance(task_id, bool) or not isinstance(task_id, int)):
            raise TypeError(f"task_id={task_id!r}; expected a ps task index (int) or None")
        if detail is None and original_exception is not None:
            detail = str(original_exception)
        self.task_type = "ps"
        self.task_id: int | None = task_id
        self.address = address
        self.original_exception = original_exception
        self.detail = detail
        super().__init__(_ps_message(task_id, address, detail))

    def __reduce__(self) -> str | tuple[Any, ...]:
        # The constructor's arguments, not ``args`` (the message): an exception pickles as
        # ``cls(*args)`` by default, which would lose the task here. A subclass with its own
        # constructor keeps the default.
        if type(self).__init__ is not PSUnavailableError.__init__:
            return super().__reduce__()
        fields = (self.task_id, self.address, self.original_exception, self.detail)
        return (type(self), fields, self.__dict__)


def _ps_message(task_id: int | None, address: str | None, detail: str | None) -> str:
    if task_id is None and address is None:
        return detail or "a parameter server task is unavailable"
    task = "parameter server task" if task_id is None else f"parameter server task {task_id}"
    where = f" ({address})" if address else ""
    return f"{task}{where} is unavailable" + (f": {detail}" if detail else "")


class AbortedError(JaxClusterError):
    """The operation was aborted, e.g. a per-worker resource on a worker that failed."""


class DeadlineExceededError(JaxClusterError, TimeoutError):
    """A deadline passed before the operation completed (gRPC ``DEADLINE_EXCEEDED``)."""


class InvalidArgumentError(JaxClusterError, ValueError):
    """A request was malformed (gRPC ``INVALID_ARGUMENT``)."""


class NotFoundError(JaxClusterError, LookupError):
    """Something named by a request does not exist (gRPC ``NOT_FOUND``)."""


class UnauthenticatedError(JaxClusterError, PermissionError):
    """A request carried no valid credentials (gRPC ``UNAUTHENTICATED``)."""


class ResourceExhaustedError(JaxClusterError):
    """A request or response exceeded a size or capacity limit (gRPC ``RESOURCE_EXHAUSTED``)."""


class InternalError(JaxClusterError):
    """An invariant broke inside jaxcluster or a worker (gRPC ``INTERNAL``)."""


class FailedPreconditionError(JaxClusterError):
    """The system is not in a state where the operation can run (gRPC ``FAILED_PRECONDITION``)."""


class OutOfRangeError(JaxClusterError, StopIteration):
    """An iterator is exhausted: ``next()`` on a per-worker iterator past its last element.

    TF raises ``tf.errors.OutOfRangeError`` there, and ported code catches it around
    ``schedule``/``join``/``fetch``. It is also a ``StopIteration``, so a ``for`` loop over a
    per-worker iterator inside a closure simply ends.

    Example::

        try:
            while True:
                coordinator.schedule(step, args=(per_worker_iterator,))
        except errors.OutOfRangeError:
            pass  # one worker's iterator ran out: the epoch is over
    """


class MissingExtraError(JaxClusterError, ImportError):
    """An optional dependency of the feature in use is not installed.

    ``extra`` names the jaxcluster extra that brings it and ``install`` is the command to run,
    e.g. ``pip install 'jaxcluster[k8s]'``.
    """

    def __init__(self, message: str, *, extra: str, name: str | None = None) -> None:
        super().__init__(message, name=name)
        self.extra = extra
        self.install = f"pip install 'jaxcluster[{extra}]'"


def _unwrap(exc: BaseException | None) -> BaseException | None:
    while isinstance(exc, (ClosureInputError, ClosureAbortedError)):
        exc = exc.original_exception
    return exc


class ClosureInputError(JaxClusterError):
    """A closure's input could not be produced, e.g. its per-worker iterator failed to build.

    ``original_exception`` holds the underlying error, unwrapped from any nesting.
    """

    def __init__(self, original_exception: BaseException | None) -> None:
        self.original_exception = _unwrap(original_exception)
        super().__init__(
            f"Input has an error: {self.original_exception!r}; the closure that used it was not run"
        )


class ClosureAbortedError(JaxClusterError):
    """A closure was aborted because something it depended on failed.

    ``original_exception`` holds the underlying error, unwrapped from any nesting.
    """

    def __init__(self, original_exception: BaseException | None) -> None:
        self.original_exception = _unwrap(original_exception)
        super().__init__(f"Closure aborted: {self.original_exception!r}")


class RemoteError(JaxClusterError):
    """A user exception raised on a worker whose type could not be rebuilt locally.

    ``type_name`` is the remote exception's qualified type name and ``remote_traceback`` the
    traceback text the worker captured.
    """

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback
        super().__init__(f"{type_name}: {message}")

    def __str__(self) -> str:
        text = f"{self.type_name}: {self.message}"
        if self.remote_traceback:
            text += f"\n\nRemote traceback:\n{self.remote_traceback}"
        return text
