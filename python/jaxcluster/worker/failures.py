"""Capturing an exception raised on a worker so the coordinator can rebuild it, and
telling the coordinator when it is a parameter-server failure."""

from __future__ import annotations

import traceback
from types import TracebackType
from typing import Any

from jaxcluster import wire
from jaxcluster._ps_failures import failed_ps_task

__all__ = ["describe_exception"]

# Frames from these files are the executor's own plumbing, not the user's code.
_INTERNAL_FILES: frozenset[str] = frozenset()


def _user_traceback(exc: BaseException, internal_files: frozenset[str]) -> TracebackType | None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in internal_files:
        tb = tb.tb_next
    return tb


def _pickled(exc: BaseException) -> tuple[bytes | None, list[bytes]]:
    """Pickles ``exc`` if it also unpickles: an exception whose ``__init__`` takes other
    arguments than its ``args`` pickles fine but fails on load, so try both here."""
    try:
        encoded = wire.encode(exc)
        wire.decode(encoded.pickle, encoded.buffers)
    except Exception:
        return None, []
    return encoded.pickle, encoded.buffers


def describe_exception(
    exc: BaseException, internal_files: frozenset[str] = _INTERNAL_FILES
) -> dict[str, Any]:
    """Keyword arguments for ``WorkerJob.reply_error`` describing ``exc``.

    Type name, module, message and traceback text are always there; ``exception`` is the
    pickled exception, or ``None`` when it cannot make the round trip. ``ps_task`` is the
    ps task a ``PSUnavailableError`` (possibly wrapped) names, read from its fields, so the
    coordinator can apply TF's transient-ps-failure rule without parsing the message.
    """
    tb = _user_traceback(exc, internal_files)
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        message = str(exc)
    except Exception as str_error:  # a broken __str__ must not hide the original error
        message = f"<str() of the exception failed: {str_error!r}>"
    pickled, buffers = _pickled(exc)
    return {
        "type_name": type(exc).__qualname__,
        "module": type(exc).__module__,
        "message": message,
        "traceback": text,
        "exception": pickled,
        "exception_buffers": buffers,
        "ps_task": failed_ps_task(exc),
    }
