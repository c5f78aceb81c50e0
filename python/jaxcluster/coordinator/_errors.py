"""Rebuilding a closure's failure, as the dispatcher reports it, into a Python exception.

A failed or cancelled closure arrives as a ``jaxcluster._core.ClosureError`` (a frozen,
typed record; see ``_core.pyi``). The Rust binding calls :func:`build_exception` with it
(``jaxcluster._native`` registers it) whenever it must raise a closure's error (the
pending error of ``schedule``/``join``/``done``), and
:class:`~jaxcluster.coordinator.RemoteValue` calls it for its own result, so both raise the
same thing. Its ``kind`` is an ``ErrorKind``: ``USER``, ``FUNCTION_LOAD``, ``INPUT``,
``INFRASTRUCTURE`` or ``CANCELLED`` (equal to their spellings, ``"user"``...); an
infrastructure failure's ``type_name`` is the :mod:`jaxcluster.errors` class of its gRPC
``code`` (Rust owns that table).

Example::

    error = ClosureError("cancelled", type_name="CancelledError", message="stopped")
    isinstance(build_exception(error), errors.CancelledError)  # True
"""

from __future__ import annotations

from typing import Any

from jaxcluster import errors, wire
from jaxcluster._native import core

__all__ = ["add_note", "build_exception", "rebuild_exception", "waiting_hint"]


def add_note(exc: BaseException, note: str) -> None:
    """Adds ``note`` to ``exc`` (on Python 3.10, which has no notes, as a chained cause)."""
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:  # Python 3.11+
        add_note(note)
    elif exc.__cause__ is None:
        # Python 3.10 has no notes; chain a RemoteError so the text still shows.
        exc.__cause__ = errors.RemoteError(type(exc).__qualname__, note)


def _where(error: Any) -> str:
    return f" on worker {error.worker}" if error.worker else ""


def rebuild_exception(error: Any) -> BaseException:
    """The exception a worker reported in ``error`` (a ``ClosureError``), as its own type.

    The pickled exception is used when it unpickles here, with the worker and the remote
    traceback added as a note; otherwise a :class:`~jaxcluster.errors.RemoteError` carries
    the type name, message and traceback. For an ``"input"`` error this is the input's own
    failure (:func:`build_exception` wraps it in ``ClosureInputError``).
    """
    exc: Any = None
    if error.exception:
        try:
            exc = wire.decode(error.exception, error.exception_buffers)
        except Exception:
            exc = None  # e.g. its class does not exist in this process
    if isinstance(exc, BaseException):
        where = f"Raised{_where(error)}."
        traceback = error.traceback
        add_note(exc, f"{where} Remote traceback:\n{traceback}" if traceback else where)
        return exc
    module, type_name = error.module, error.type_name
    own = getattr(errors, type_name, None) if module == errors.__name__ else None
    if isinstance(own, type) and issubclass(own, errors.JaxClusterError):
        # One of ours, made by the dispatcher (e.g. a per-worker value lost with its
        # worker): its class exists here, so it comes back as itself when it can be made
        # from a message (the wrapper classes need an exception instead).
        try:
            rebuilt = own(error.message)
        except TypeError:
            rebuilt = None
        if rebuilt is not None:
            if error.worker:
                add_note(rebuilt, f"Raised{_where(error)}.")
            return rebuilt
    qualified = type_name if module in ("", "builtins") else f"{module}.{type_name}"
    message = error.message
    if error.worker:
        message = f"{message} (raised on worker {error.worker})"
    return errors.RemoteError(qualified or "Exception", message, error.traceback)


def _ps_failure(exc: BaseException, error: Any) -> BaseException:
    """``exc``, unless the worker reported a ps failure that did not survive pickling: then
    a ``PSUnavailableError`` with the task, so callers can rely on the type."""
    if error.ps_task is None or isinstance(exc, errors.PSUnavailableError):
        return exc
    return errors.PSUnavailableError(
        int(error.ps_task), None, exc, f"{error.message} (reported by worker {error.worker})"
    )


def build_exception(error: Any) -> BaseException:
    """The exception a failed or cancelled closure's ``ClosureError`` stands for.

    User errors (and functions that failed to load on the worker) come back as their own
    type, with the worker and the remote traceback in a note, when the worker could pickle
    them and this process can unpickle them, else as
    :class:`~jaxcluster.errors.RemoteError`; input errors as
    :class:`~jaxcluster.errors.ClosureInputError` around the original; infrastructure
    errors as the :mod:`jaxcluster.errors` class of their gRPC code; a cancellation as
    :class:`~jaxcluster.errors.CancelledError`. Every message names the worker.
    """
    kind = error.kind
    if kind == core.ErrorKind.CANCELLED:
        return errors.CancelledError(error.message)
    if kind in (core.ErrorKind.USER, core.ErrorKind.FUNCTION_LOAD):
        return _ps_failure(rebuild_exception(error), error)
    if kind == core.ErrorKind.INPUT:
        wrapped = errors.ClosureInputError(_ps_failure(rebuild_exception(error), error))
        add_note(wrapped, f"The input failed{_where(error)}.")
        return wrapped
    if kind == core.ErrorKind.INFRASTRUCTURE:
        cls = getattr(errors, error.type_name, None)
        if not (isinstance(cls, type) and issubclass(cls, errors.JaxClusterError)):
            cls = errors.InternalError
        text = f"{error.message} (on worker {error.worker})" if error.worker else error.message
        if cls is errors.InternalError and error.code not in (None, "INTERNAL"):
            text = f"{error.code}: {text}"
        return cls(text)
    raise ValueError(
        f"unknown closure error kind {kind!r}; expected 'user', 'function_load', 'input', "
        "'infrastructure' or 'cancelled'"
    )


def waiting_hint(workers: Any) -> str:
    """Why a closure may not have ended yet, from the dispatcher's worker statuses (what
    ``RemoteValue.fetch(timeout=...)`` adds to its ``DeadlineExceededError``)."""
    up = [w for w in workers if w.state == core.WorkerState.UP]
    down = [w for w in workers if w.state != core.WorkerState.UP]
    troubles = "; ".join(
        f"worker {w.address} {w.state}" + (f": {w.last_error}" if w.last_error else "")
        for w in down[:4]
    ) + (f"; and {len(down) - 4} more" if len(down) > 4 else "")
    if not up:
        return (
            f"no worker is serving ({troubles}); the coordinator keeps reconnecting "
            "until recovery_timeout= (or JAXCLUSTER_WORKER_RECOVERY_SEC, default 3600 s) "
            "passes, then fails what is queued with UnavailableError"
        )
    hint = (
        f"it is still queued or running ({len(up)} of {len(workers)} workers serving) — "
        "fetch again, or call join() first"
    )
    return hint + (f"; not serving: {troubles}" if down else "")
