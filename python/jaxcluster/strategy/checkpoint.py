"""The checkpoint file: every variable in one file, replaced atomically.

Layout (all integers little-endian)::

    b"JAXCLUSTER-CKPT\\0"        16 bytes, magic
    format version             u32 (1)
    header length H            u64
    header                     H bytes of UTF-8 JSON: {"variables": [{"name", "dtype",
                               "shape", "offset", "nbytes"}, ...], "jaxcluster_version"}
    data                       the arrays' bytes, C order, little-endian, at their offsets
    SHA-256                    32 bytes, of everything before it

**Atomic replacement.** :func:`write_checkpoint` writes a temporary file in the target's
directory, fsyncs it, renames it over the target and fsyncs the directory: a crash at any
moment leaves either the previous checkpoint or the new one, never a mix. A writer holds
an exclusive ``flock`` on its temporary file while it writes; a crash leaves the file (a
``.NAME.*.tmp`` beside the target, which readers ignore) with the lock gone, and the next
save to that name removes every such file no process holds (so a save killed mid-write
costs disk space only until the next save).

**Validation.** :func:`read_checkpoint` checks the magic, the version, the digest and every
entry's bounds before returning anything, and raises ``ValueError`` saying what is wrong.

Example::

    write_checkpoint("ckpt.jaxc", {"w": np.zeros(3, np.float32)})
    read_checkpoint("ckpt.jaxc")["w"]          # array([0., 0., 0.], dtype=float32)
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import math
import os
import struct
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

__all__ = ["FORMAT_VERSION", "MAGIC", "read_checkpoint", "write_checkpoint"]

MAGIC = b"JAXCLUSTER-CKPT\0"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<16sIQ")
_DIGEST_BYTES = 32

#: Test hook: called with the temporary file's path after it is written and synced, just
#: before the rename. A test makes it raise or kill the process to simulate a crash there.
_before_rename: Callable[[str], None] | None = None

_SUPPORTED = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
)


def _dtype(name: str) -> np.dtype[Any]:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name).newbyteorder("<")


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: str | os.PathLike[str], arrays: Mapping[str, Any]) -> None:
    """Writes ``arrays`` (name → array) to ``path``, replacing any file there atomically."""
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"checkpoint path {str(target)!r} is a directory; expected a file")
    entries, blobs, offset = [], [], 0
    for name, value in arrays.items():
        array = np.asarray(value, order="C")
        if array.dtype.name not in _SUPPORTED:
            raise TypeError(f"variable {name!r} has dtype {array.dtype.name}; cannot checkpoint it")
        data = array.astype(_dtype(array.dtype.name), copy=False).tobytes()
        entries.append(
            {
                "name": name,
                "dtype": array.dtype.name,
                "shape": list(array.shape),
                "offset": offset,
                "nbytes": len(data),
            }
        )
        blobs.append(data)
        offset += len(data)
    from jaxcluster import __version__

    header = json.dumps({"variables": entries, "jaxcluster_version": __version__}).encode()
    directory = target.parent if str(target.parent) else Path(".")
    _remove_abandoned(directory, target.name)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        # Held (the descriptor stays open) until the file is renamed or removed: tells
        # another save that this file is in use.
        fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(fd, "wb", closefd=False) as f:
            digest = hashlib.sha256()
            for piece in (_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)), header, *blobs):
                f.write(piece)
                digest.update(piece)
            f.write(digest.digest())
            f.flush()
            os.fsync(f.fileno())
        if _before_rename is not None:
            _before_rename(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    _fsync_directory(directory)


#: A temporary file this new and still empty may be a writer's that has not locked it yet.
_JUST_CREATED_SECONDS = 10.0


def _remove_abandoned(directory: Path, name: str) -> None:
    """Removes the temporary files of saves to ``name`` that died mid-write: those no
    process holds a lock on (a live writer locks its file right after creating it)."""
    for candidate in directory.glob(f".{glob.escape(name)}.*.tmp"):
        try:
            fd = os.open(candidate, os.O_RDONLY)
        except OSError:
            continue  # renamed or removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live writer holds it
        try:
            info = os.fstat(fd)
            if info.st_size > 0 or time.time() - info.st_mtime > _JUST_CREATED_SECONDS:
                with contextlib.suppress(OSError):
                    os.unlink(candidate)
        finally:
            os.close(fd)


def _corrupt(path: Path, what: str) -> ValueError:
    return ValueError(f"checkpoint {str(path)!r} is corrupt or not a jaxcluster checkpoint: {what}")


_Entry = tuple[str, np.dtype[Any], tuple[int, ...], int, int]


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value: Any) -> str:
    """``repr(value)``, cut short: a crafted header can nest too deep to print."""
    try:
        text = repr(value)
    except RecursionError:
        return f"<a {type(value).__name__} nested too deep to show>"
    return text if len(text) <= 200 else text[:200] + "..."


def _entry(raw: Any, data_bytes: int, path: Path) -> _Entry:
    if not isinstance(raw, dict):
        raise _corrupt(path, f"a header entry is {type(raw).__name__}, expected an object")
    name, dtype, shape = raw.get("name"), raw.get("dtype"), raw.get("shape")
    offset, nbytes = raw.get("offset"), raw.get("nbytes")
    malformed = _corrupt(
        path, f"header entry {_shown(raw)} is malformed or points outside the data"
    )
    if not (isinstance(name, str) and name and isinstance(dtype, str) and dtype in _SUPPORTED):
        raise malformed
    if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
        raise malformed
    if not (_is_count(offset) and _is_count(nbytes) and offset + nbytes <= data_bytes):
        raise malformed
    dims = tuple(int(d) for d in shape)
    np_dtype = _dtype(dtype)
    if math.prod(dims) * np_dtype.itemsize != nbytes:
        raise _corrupt(path, f"variable {name!r} is {dtype}{list(dims)} but has {nbytes} bytes")
    return name, np_dtype, dims, offset, nbytes


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every array in the checkpoint at ``path``, by name, in the order written."""
    source = Path(path)
    blob = source.read_bytes()
    if len(blob) < _PREFIX.size + _DIGEST_BYTES:
        raise _corrupt(source, f"it is {len(blob)} bytes, shorter than any checkpoint")
    magic, version, header_len = _PREFIX.unpack_from(blob)
    if magic != MAGIC:
        raise _corrupt(source, f"it starts with {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {str(source)!r} has format version {version}; this jaxcluster reads "
            f"version {FORMAT_VERSION} (written by a newer jaxcluster?)"
        )
    body, digest = blob[:-_DIGEST_BYTES], blob[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise _corrupt(source, "its SHA-256 does not match (truncated or modified)")
    data_start = _PREFIX.size + header_len
    if data_start > len(body):
        raise _corrupt(source, f"its header length {header_len} runs past the end")
    try:
        header = json.loads(body[_PREFIX.size : data_start])
        entries = header["variables"]
        if not isinstance(entries, list):
            raise TypeError("'variables' is not a list")
    except RecursionError:
        raise _corrupt(source, "its header nests JSON deeper than any checkpoint does") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise _corrupt(source, f"its header is not valid ({exc})") from None
    data = memoryview(body)[data_start:]
    arrays: dict[str, np.ndarray] = {}
    for raw in entries:
        name, dtype, shape, offset, nbytes = _entry(raw, len(data), source)
        if name in arrays:
            raise _corrupt(source, f"variable {name!r} appears twice")
        array = np.frombuffer(data[offset : offset + nbytes], dtype=dtype).reshape(shape)
        arrays[name] = array.astype(array.dtype.newbyteorder("="), copy=True)
    return arrays
