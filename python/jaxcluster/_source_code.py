"""Code objects that keep their file name and source lines when pickled by value.

A function defined in ``__main__``, a notebook cell, a lambda or a local function is
pickled by value: its code object travels to the worker. cloudpickle (3.1.3 and later)
replaces the code's file name with ``"<dynamic-code>"`` to make its payloads
deterministic, and even before that a worker on another host usually has no copy of the
user's file, so a traceback raised there named no real file or showed no source line.

:class:`SourcePickler` pickles every code object whole with :mod:`marshal` (the format of
``.pyc`` files, which keeps ``co_filename`` and the line table of the code and every code
object nested in it) together with the source lines it spans, read here through
:mod:`linecache` (so notebook cells work too). Unpickling, :func:`load_code` puts those
lines into the worker's :mod:`linecache` under the real file name, so ``traceback`` quotes
them as if the file were there. The payload no longer depends on cloudpickle's handling of
code objects, which has changed between releases.

``marshal`` ties a payload to one Python minor version, as cloudpickle's by-value code
already does; :func:`load_code` checks the version and says what to change rather than
running bytecode of another version.

Example::

    payload = dumps(lambda x: x + 1)   # bytes; pickle.loads(payload)(1) == 2
"""

from __future__ import annotations

import io
import linecache
import marshal
import pickle
import sys
import types
from collections import ChainMap
from typing import Any

import cloudpickle

__all__ = ["PICKLE_PROTOCOL", "SourcePickler", "dumps", "load_code"]

PICKLE_PROTOCOL = 5

#: At most this many source lines travel with one code object (a generated function can be
#: huge; its traceback then shows no source past the cap, nothing else changes).
_MAX_LINES = 5000
_PYTHON = tuple(sys.version_info[:2])


def _last_line(code: types.CodeType) -> int:
    """The last source line ``code`` or any code object nested in it executes."""
    last = code.co_firstlineno
    for _start, _end, line in code.co_lines():
        if line is not None and line > last:
            last = line
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            last = max(last, _last_line(const))
    return last


def _source_lines(code: types.CodeType) -> tuple[str, ...]:
    """The lines of ``code``'s source file it spans, or ``()`` when they are unknown."""
    lines = linecache.getlines(code.co_filename)
    if not lines:
        return ()
    first = code.co_firstlineno
    last = min(_last_line(code), first + _MAX_LINES - 1)
    return tuple(lines[first - 1 : last])


def reduce_code(code: types.CodeType) -> tuple[Any, tuple[Any, ...]]:
    """Pickle reducer: ``code`` as marshal bytes plus the source lines it spans."""
    return load_code, (
        marshal.dumps(code),
        _PYTHON,
        code.co_filename,
        code.co_firstlineno,
        _source_lines(code),
    )


def load_code(
    marshalled: bytes,
    python: tuple[int, int],
    filename: str,
    first_line: int,
    lines: tuple[str, ...],
) -> types.CodeType:
    """Unpickling: the code object, with its source lines made known to :mod:`linecache`.

    Raises ``pickle.UnpicklingError`` when the code was made by another Python minor
    version (its bytecode cannot run here).
    """
    if tuple(python) != _PYTHON:
        raise pickle.UnpicklingError(
            f"this function was pickled by value under Python {python[0]}.{python[1]} but "
            f"this process runs Python {_PYTHON[0]}.{_PYTHON[1]}; bytecode does not carry "
            "across minor versions. Run the same Python minor version everywhere, or define "
            "the function in a module installed on both sides (it is then sent by reference)"
        )
    code = marshal.loads(marshalled)
    if not isinstance(code, types.CodeType):
        raise pickle.UnpicklingError(
            f"expected marshalled code for {filename!r}, got {type(code).__qualname__}"
        )
    if lines:
        _remember(filename, first_line, list(lines))
    return code


def _remember(filename: str, first_line: int, lines: list[str]) -> None:
    """Makes ``lines`` (starting at line ``first_line``) what :mod:`linecache` says of
    ``filename``, keeping whatever else it knows of that file.

    An entry whose modification time is ``None`` is never invalidated by
    ``linecache.checkcache`` (which ``traceback`` calls), as for lines of code loaded
    by a module loader.
    """
    start = first_line - 1
    entry = linecache.cache.get(filename)
    if entry is not None and len(entry) == 4 and entry[1] is None:
        known = list(entry[2])  # lines an earlier payload (or a loader) brought
    else:
        known = linecache.getlines(filename)
        if known[start : start + len(lines)] == lines:
            return  # this host has the same file: it answers for itself
        known = list(known)
    if len(known) < start + len(lines):
        known.extend(["\n"] * (start + len(lines) - len(known)))
    known[start : start + len(lines)] = lines
    linecache.cache[filename] = (sum(map(len, known)), None, known, filename)


class SourcePickler(cloudpickle.Pickler):  # type: ignore[misc, name-defined]
    """cloudpickle's pickler, with code objects pickled by :func:`reduce_code`."""

    dispatch_table = ChainMap({types.CodeType: reduce_code}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled by :class:`SourcePickler` (protocol 5, in-band buffers)."""
    stream = io.BytesIO()
    SourcePickler(stream, protocol=PICKLE_PROTOCOL).dump(obj)
    return stream.getvalue()
