"""Rebuilding a closure's failure, as the dispatcher reports it, into a Python exception.

The Rust binding calls :func:`build_exception` with a cell's result tuple whenever it must
raise a closure's error (the pending error of ``schedule``/``join``/``done``), and
:class:`~jaxcluster.coordinator.RemoteValue` calls it for its own result, so both raise the
same thing. Result tuples:

- ``("error", kind, type_name, module, message, traceback, pickled_exception, worker,
  ps_task)`` with ``kind`` ``"user"``, ``"input"`` or ``"infra:<GRPC_CODE_NAME>"`` and
  ``ps_task`` the parameter-server task of a ps failure or ``None`` (optional);
- ``("cancelled", message)``.

Example::

    exc = build_exception(("cancelled", "another closure failed first"))
    isinstance(exc, errors.CancelledError)  # True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxcluster import errors, wire

__all__ = ["build_exception"]

#: gRPC code name -> the jaxcluster.errors class it is raised as.
_INFRA_CLASSES: dict[str, type[errors.JaxClusterError]] = {
    "CANCELLED": errors.CancelledError,
    "UNAVAILABLE": errors.UnavailableError,
    "ABORTED": errors.AbortedError,
    "DEADLINE_EXCEEDED": errors.DeadlineExceededError,
    "INVALID_ARGUMENT": errors.InvalidArgumentError,
    "OUT_OF_RANGE": errors.InvalidArgumentError,
    "NOT_FOUND": errors.NotFoundError,
    "UNAUTHENTICATED": errors.UnauthenticatedError,
    "PERMISSION_DENIED": errors.UnauthenticatedError,
    "RESOURCE_EXHAUSTED": errors.ResourceExhaustedError,
    "FAILED_PRECONDITION": errors.FailedPreconditionError,
    "ALREADY_EXISTS": errors.FailedPreconditionError,
    "INTERNAL": errors.InternalError,
}


def _add_note(exc: BaseException, note: str) -> None:
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:  # Python 3.11+
        add_note(note)
    elif exc.__cause__ is None:
        # Python 3.10 has no notes; chain a RemoteError so the text still shows.
        exc.__cause__ = errors.RemoteError(type(exc).__qualname__, note)


def _user_exception(
    type_name: str, module: str, message: str, traceback: str, pickled: bytes, worker: str
) -> BaseException:
    """The user's exception as its own type when it unpickles here, else a RemoteError."""
    exc: Any = None
    if pickled:
        try:
            exc = wire.decode(pickled)
        except Exception:
            exc = None  # e.g. its class does not exist in this process
    if isinstance(exc, BaseException):
        where = f"Raised on worker {worker}."
        _add_note(exc, f"{where} Remote traceback:\n{traceback}" if traceback else where)
        return exc
    qualified = type_name if module in ("", "builtins") else f"{module}.{type_name}"
    return errors.RemoteError(
        qualified or "Exception", f"{message} (raised on worker {worker})", traceback
    )


def _ps_failure(exc: BaseException, ps_task: Any, message: str, worker: str) -> BaseException:
    """``exc``, unless the worker reported a ps failure that did not survive pickling: then
    a ``PSUnavailableError`` with the task, so callers can rely on the type."""
    if ps_task is None or isinstance(exc, errors.PSUnavailableError):
        return exc
    return errors.PSUnavailableError(
        int(ps_task), None, exc, f"{message} (reported by worker {worker})"
    )


def build_exception(result: Sequence[Any]) -> BaseException:
    """The exception a failed or cancelled closure's result tuple stands for.

    User errors come back as their own type (with the worker and the remote traceback in a
    note) when the worker could pickle them and this process can unpickle them, else as
    :class:`~jaxcluster.errors.RemoteError`; input errors as
    :class:`~jaxcluster.errors.ClosureInputError` around the original; infrastructure
    errors as the ``jaxcluster.errors`` class of their gRPC code. Every message names the
    worker.
    """
    if not result or not isinstance(result[0], str):
        raise TypeError(
            f"expected a closure result tuple starting with 'error' or 'cancelled', got {result!r}"
        )
    tag = result[0]
    if tag == "cancelled" and len(result) >= 2:
        return errors.CancelledError(str(result[1]))
    if tag != "error" or len(result) < 8:
        raise ValueError(
            f"expected ('error', kind, type_name, module, message, traceback, "
            f"pickled_exception, worker) or ('cancelled', message), got a {tag!r} tuple of "
            f"{len(result)} items"
        )
    _, kind, type_name, module, message, traceback, pickled, worker = result[:8]
    ps_task = result[8] if len(result) > 8 else None
    kind = str(kind)
    if kind == "user":
        exc = _user_exception(type_name, module, message, traceback, pickled, worker)
        return _ps_failure(exc, ps_task, message, worker)
    if kind == "input":
        original = _user_exception(type_name, module, message, traceback, pickled, worker)
        original = _ps_failure(original, ps_task, message, worker)
        wrapped = errors.ClosureInputError(original)
        _add_note(wrapped, f"The input failed on worker {worker}.")
        return wrapped
    if kind.startswith("infra:"):
        code = kind.partition(":")[2]
        cls = _INFRA_CLASSES.get(code, errors.InternalError)
        text = f"{message} (on worker {worker})"
        if cls is errors.InternalError and code != "INTERNAL":
            text = f"{code}: {text}"
        return cls(text)
    raise ValueError(
        f"unknown closure error kind {kind!r}; expected 'user', 'input' or 'infra:<CODE>'"
    )
