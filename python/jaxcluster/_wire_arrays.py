"""How arrays cross the wire: part of :mod:`jaxcluster.wire`, which re-exports the public
names.

An array leaves as its raw memory, out of band beside the pickle, and comes back as a numpy
array over the received bytes (:func:`rebuild_array`). A ``jax.Array`` leaves as its host
memory, borrowed rather than copied since it never changes; one encoded with
``mark_device_arrays=True`` comes back through :func:`rebuild_device_array`, a ``jax.Array``
again on the receiver's default device where the receiver decodes inside
:func:`device_arrays` (a worker pulling a kept value), numpy everywhere else. The buffers
handed to the Rust core are borrowed where their memory cannot change (:func:`out_of_band`).

Example::

    from jaxcluster import wire
    with wire.device_arrays():
        value = wire.decode(encoded.pickle, encoded.buffers)
"""

from __future__ import annotations

import pickle
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeGuard, cast

if TYPE_CHECKING:
    from typing_extensions import Buffer as BufferProtocol

    from jaxcluster._core import Buffer

__all__ = [
    "PICKLE_PROTOCOL",
    "device_arrays",
    "out_of_band",
    "rebuild_array",
    "rebuild_device_array",
    "reduce_jax_array",
    "reduce_jax_array_marked",
    "reduce_ndarray",
]

#: The protocol every value is pickled with (out-of-band buffers need 5).
PICKLE_PROTOCOL = 5


def rebuild_array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    """Unpickling: the numpy array of ``dtype`` and ``shape`` over ``buffer``."""
    import numpy as np

    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


class _Decoding(threading.local):
    """Whether this thread decodes inside :func:`device_arrays`."""

    device = False


_decoding = _Decoding()


@contextmanager
def device_arrays() -> Iterator[None]:
    """Inside it, this thread's :func:`decode` makes each array that was a ``jax.Array``
    where it was encoded with ``mark_device_arrays=True`` a ``jax.Array`` again, on this
    process's default device; elsewhere such arrays decode as numpy, as every array does.
    A worker pulling a kept value from its holder decodes this way, so a closure gets the
    same kind of value whichever worker it runs on.

    Example::

        with wire.device_arrays():
            value = wire.decode(encoded.pickle, encoded.buffers)
    """
    before = _decoding.device
    _decoding.device = True
    try:
        yield
    finally:
        _decoding.device = before


def rebuild_device_array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    """Unpickling an array that was a ``jax.Array`` where it was encoded (see
    :func:`device_arrays`): a ``jax.Array`` on the default device inside
    :func:`device_arrays`, else the numpy array over ``buffer``."""
    array = rebuild_array(buffer, dtype, shape)
    if not _decoding.device:
        return array
    import jax

    return jax.device_put(array)


def reduce_ndarray(array: Any) -> Any:
    dtype = array.dtype
    if dtype.kind in "biufc" and dtype.fields is None and array.flags.c_contiguous:
        return rebuild_array, (pickle.PickleBuffer(array), dtype.str, array.shape)
    return array.__reduce_ex__(PICKLE_PROTOCOL)


def reduce_jax_array(array: Any, marked: bool = False) -> Any:
    """A ``jax.Array`` as its host memory: ``numpy.asarray`` is a view of a CPU array (one
    device-to-host copy for an accelerator's), and as a ``jax.Array`` never changes, that
    memory is borrowed, not copied, when the value is sent. ``marked``: rebuilt by
    :func:`rebuild_device_array`, so a decoder inside :func:`device_arrays` makes it a
    ``jax.Array`` again."""
    import numpy as np

    host = np.asarray(array)
    dtype = host.dtype
    if dtype.kind in "biufc" and dtype.fields is None and host.flags.c_contiguous and host.size:
        from jaxcluster._native import core

        # A Buffer exports the buffer protocol (PyO3's slot); typeshed's Buffer protocol
        # wants the `__buffer__` method Python 3.12 adds for such types, so mypy is told.
        borrowed = pickle.PickleBuffer(cast("BufferProtocol", core.Buffer.borrow(host)))
        rebuild = rebuild_device_array if marked else rebuild_array
        return rebuild, (borrowed, dtype.str, host.shape)
    return reduce_ndarray(host)


def out_of_band(buffers: list[pickle.PickleBuffer], zero_copy: bool) -> list[Any]:
    """The pickler's out-of-band buffers as ``bytes``, or (``zero_copy``) as what the Rust
    core takes: a ``Buffer`` for memory that cannot change, else the ``PickleBuffer``."""
    if not zero_copy:
        return [b.raw().tobytes() for b in buffers]
    return [_shared(b) for b in buffers]


def _shared(buffer: pickle.PickleBuffer) -> Any:
    view = buffer.raw()
    root = view.obj
    for _ in range(64):  # a numpy view's owner, and its owner...
        base = getattr(root, "base", None)
        if base is None:
            break
        root = base
    if _is_core_buffer(root):  # received bytes (immutable) or a borrowed jax.Array
        return root.within(view)
    if type(root) is bytes:  # e.g. numpy.frombuffer(b"..."): immutable too
        from jaxcluster._native import core

        return core.Buffer.borrow(root).within(view)
    return buffer


def _is_core_buffer(obj: Any) -> TypeGuard[Buffer]:
    core = sys.modules.get("jaxcluster._core")
    return core is not None and type(obj) is core.Buffer


def reduce_jax_array_marked(array: Any) -> Any:
    return reduce_jax_array(array, marked=True)
