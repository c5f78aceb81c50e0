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
    """A parameter-server task could not be reached."""


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
