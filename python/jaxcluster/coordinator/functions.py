"""Turning the callables given to ``schedule`` into payloads the workers can run.

A ``jax.jit`` function called with arrays is exported with ``jax.export`` for the workers'
platforms, once per argument signature (tree structure, shapes, dtypes); anything else is
cloudpickled. Both are named by the SHA-256 of their bytes, so a worker receives each
payload once and every later closure refers to it by hash.

Serializing is the costly part of ``schedule`` (tens of microseconds for a small
cloudpickle, tens of milliseconds for an export), so results are cached, weak-keyed on the
function. A plain function's cached pickle is reused only while the objects it captures
(closure cells, the globals it names, its defaults) are the very same objects: rebinding
any of them re-serializes it. Objects mutated in place are not noticed; pass changing
values as arguments.

Example::

    serializer = FunctionSerializer(platforms=lambda: ("cpu",))
    sent = serializer.serialize(jax.jit(lambda x: x * 2), (np.ones(3, np.float32),), {})
    sent.kind == KIND_JAX_EXPORT   # True

:func:`pickle_function` and :func:`export_function` are the two halves on their own, for
code that talks to a worker directly (``jaxcluster._core.WorkerClient``).
"""

from __future__ import annotations

import logging
import operator
import sys
import threading
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jaxcluster import _source_code, wire
from jaxcluster._native import core

__all__ = [
    "KIND_CLOUDPICKLE",
    "KIND_JAX_EXPORT",
    "FunctionSerializer",
    "SerializedFunction",
    "export_function",
    "function_name",
    "is_jitted",
    "pickle_function",
]

#: Function kinds, as the protocol names them (``Dispatcher.register_function``,
#: ``WorkerClient.register_function``, ``WorkerJob.function_kind``).
KIND_CLOUDPICKLE = core.FunctionKind.CLOUDPICKLE
KIND_JAX_EXPORT = core.FunctionKind.JAX_EXPORT

_log = logging.getLogger("jaxcluster.coordinator")
_SCALARS = (bool, int, float, complex)


@dataclass(frozen=True)
class SerializedFunction:
    """A function as the workers receive it: content hash, kind and payload bytes.

    ``note`` says why a ``jax.jit`` function was cloudpickled instead of exported. An
    export also records what it needs of a worker: ``devices`` (its ``nr_devices``: the
    size of the mesh its shardings span) and the ``platforms`` it was lowered for; and
    ``origin``, where the function was defined, in traceback form: an export carries no
    Python code, so a remote traceback cannot name the user's line by itself.
    """

    function_hash: bytes
    kind: core.FunctionKind
    payload: bytes
    note: str = ""
    devices: int = 1
    platforms: tuple[str, ...] = ()
    name: str = ""
    origin: str = ""

    @classmethod
    def of(
        cls, kind: core.FunctionKind, payload: bytes, note: str = "", **needs: Any
    ) -> SerializedFunction:
        return cls(wire.content_hash(payload), kind, payload, note, **needs)


_jit_types: dict[type, bool] = {}


def function_name(fn: Any) -> str:
    """``fn``'s ``__qualname__`` (else ``__name__``) as messages and metrics name it; ``""``
    for a callable without one (a ``functools.partial``, a callable object)."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else ""


def is_jitted(fn: Any) -> bool:
    """Whether ``fn`` is a ``jax.jit`` function (only checked if JAX is already imported)."""
    kind = type(fn)
    known = _jit_types.get(kind)
    if known is not None:
        return known
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    # The Protocol isinstance check costs tens of microseconds: decide once per type.
    wrapped = getattr(getattr(jax, "stages", None), "Wrapped", None)
    jitted = (wrapped is not None and isinstance(fn, wrapped)) or (
        callable(getattr(fn, "lower", None)) and callable(getattr(fn, "trace", None))
    )
    _jit_types[kind] = jitted
    return jitted


def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """Names ``code`` and the code objects nested in it may look up as globals."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_global_names(const))
    return tuple(dict.fromkeys(names))


# Code objects are shared by every closure made from one definition, so this stays small.
_names_by_code: dict[types.CodeType, tuple[str, ...]] = {}


def _captured(fn: types.FunctionType) -> tuple[Any, ...]:
    """Everything a cloudpickle of ``fn`` depends on, flat, to be compared by identity: the
    code object, defaults, closure cell contents and the globals its code names."""
    code = fn.__code__
    names = _names_by_code.get(code)
    if names is None:
        names = _names_by_code[code] = _global_names(code)
    globals_ = fn.__globals__
    missing = _captured  # a sentinel no global can be
    captured: list[Any] = [code, fn.__defaults__, fn.__kwdefaults__]
    for cell in fn.__closure__ or ():
        try:
            captured.append(cell.cell_contents)
        except ValueError:  # an empty cell
            captured.append(missing)
    captured.extend([globals_.get(name, missing) for name in names])
    return tuple(captured)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    # Same code object first, so both tuples have the same layout.
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _leaf_key(leaf: Any, jax: Any, np: Any) -> tuple[tuple[int, ...], Any, bool] | None:
    """``(shape, dtype, weak_type)`` of an array-like leaf, or ``None`` for anything else."""
    if isinstance(leaf, np.ndarray):
        return (leaf.shape, leaf.dtype, False) if leaf.dtype.kind in "biufc" else None
    if isinstance(leaf, jax.Array):
        return leaf.shape, leaf.dtype, leaf.weak_type
    if isinstance(leaf, np.generic):
        return ((), leaf.dtype, False) if leaf.dtype.kind in "biufc" else None
    if type(leaf) in _SCALARS:
        # Python scalars are weakly typed under jit; keep that so promotion matches.
        return (), np.asarray(leaf).dtype, True
    return None


def _signature(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, Any] | str:
    """The argument signature ``(treedef, leaf keys)`` of an export, or why there can be
    none. Cheap: specs are only built (by :func:`_specs`) when a new export is needed."""
    import jax
    import numpy as np

    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
    keys = []
    for leaf in leaves:
        key = _leaf_key(leaf, jax, np)
        if key is None:
            return (
                f"argument leaf of type {type(leaf).__qualname__} is not an array, so "
                "jax.export cannot take it"
            )
        keys.append(key)
    return treedef, tuple(keys)


def _specs(key: tuple[Any, Any]) -> Any:
    """The ``(arg_specs, kwarg_specs)`` of ``ShapeDtypeStruct``s for a signature key."""
    import jax

    treedef, leaves = key
    specs = [
        jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype), weak_type=weak)
        for shape, dtype, weak in leaves
    ]
    return jax.tree_util.tree_unflatten(treedef, specs)


class FunctionSerializer:
    """Serializes callables for the workers and caches the results.

    ``platforms()`` returns the workers' JAX platforms (e.g. ``("cpu",)``); it is consulted
    for every ``jax.jit`` function and is part of the export cache key.

    Example::

        serializer = FunctionSerializer(platforms=lambda: ("cpu",))
        sent = serializer.serialize(lambda: 42, (), {})
        len(sent.function_hash)  # 32
    """

    def __init__(self, platforms: Callable[[], tuple[str, ...]], *, export: bool = True) -> None:
        self._platforms = platforms
        self._export_jitted = export
        self._lock = threading.Lock()
        self._pickled: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], SerializedFunction]]
        self._pickled = weakref.WeakKeyDictionary()
        self._exported: weakref.WeakKeyDictionary[Any, dict[Any, SerializedFunction]]
        self._exported = weakref.WeakKeyDictionary()
        self._noted: weakref.WeakSet[Any] = weakref.WeakSet()  # fallbacks already logged
        self.exports = 0  # how many jax.export calls were made (each a cache miss)

    def serialize(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> SerializedFunction:
        """The payload to run ``fn(*args, **kwargs)`` on a worker."""
        _check_callable(fn, "schedule()")
        jitted = is_jitted(fn)
        if jitted and not self._export_jitted:
            self._note_fallback(
                fn, "the workers are multi-host slices, where it traces on the slice"
            )
        elif jitted:
            exported = self._export(fn, args, kwargs)
            if exported is not None:
                return exported
        return self._pickle(fn, jitted)

    def _export(
        self, fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> SerializedFunction | None:
        signature = _signature(args, kwargs)
        if isinstance(signature, str):
            self._note_fallback(fn, signature)
            return None
        platforms = tuple(self._platforms())
        key = (signature, platforms)
        with self._lock:
            cached = self._exported.get(fn, {}).get(key)
        if cached is not None:
            return cached
        try:
            result = _export(fn, _specs(signature), platforms)
        except Exception as exc:  # tracing failed: let the worker run (and report) it
            self._note_fallback(fn, f"jax.export failed ({type(exc).__name__}: {exc})")
            return None
        with self._lock:
            self.exports += 1
            self._exported.setdefault(fn, {})[key] = result
        return result

    def _note_fallback(self, fn: Any, why: str) -> None:
        with self._lock:
            if fn in self._noted:
                return
            self._noted.add(fn)
        _log.info(
            "sending jax.jit function %s to the workers as a cloudpickle, not a jax.export: "
            "%s; it will be traced and compiled on each worker",
            getattr(fn, "__name__", repr(fn)),
            why,
        )

    def _pickle(self, fn: Callable[..., Any], jitted: bool) -> SerializedFunction:
        inner = getattr(fn, "__wrapped__", fn) if jitted else fn
        if not isinstance(inner, types.FunctionType):
            # Callable objects, partials, bound methods: their state can change between
            # calls and cannot be checked cheaply, so they are pickled every time.
            return SerializedFunction.of(KIND_CLOUDPICKLE, _dumps(fn))
        captured = _captured(inner)
        with self._lock:
            cached = self._pickled.get(fn)
        if cached is not None and _same(cached[0], captured):
            return cached[1]
        result = SerializedFunction.of(KIND_CLOUDPICKLE, _dumps(fn))
        try:
            with self._lock:
                self._pickled[fn] = (captured, result)
        except TypeError:  # not weak-referenceable: nothing to cache on
            pass
        return result


def _check_callable(fn: Any, caller: str) -> None:
    if not callable(fn):
        raise TypeError(
            f"{caller} needs a callable fn, got {type(fn).__qualname__}: {fn!r}; expected a "
            "callable (a function or an object) to run on the workers"
        )


def _export(fn: Any, specs: Any, platforms: Sequence[str]) -> SerializedFunction:
    """``fn`` (jitted here if it is not already) exported for ``(arg_specs, kwarg_specs)``."""
    import jax
    from jax import export

    arg_specs, kwarg_specs = specs
    jitted = fn if is_jitted(fn) else jax.jit(fn)
    exported = export.export(jitted, platforms=tuple(platforms))(*arg_specs, **kwarg_specs)
    return SerializedFunction.of(
        KIND_JAX_EXPORT,
        bytes(exported.serialize()),
        devices=int(exported.nr_devices),
        platforms=tuple(exported.platforms),
        name=str(exported.fun_name),
        origin=_origin(fn),
    )


def _origin(fn: Any) -> str:
    """Where ``fn`` (a ``jax.jit`` function or a plain one) was defined, as a traceback
    line with its source: ``File "train.py", line 12, in step`` and the ``def`` line."""
    import linecache

    inner = fn
    while hasattr(inner, "__wrapped__"):
        inner = inner.__wrapped__
    code = getattr(inner, "__code__", None)
    if code is None:
        return ""
    line = code.co_firstlineno
    source = linecache.getline(code.co_filename, line).strip()
    while source.startswith("@"):  # past the decorators, to the def line
        line += 1
        source = linecache.getline(code.co_filename, line).strip()
    where = f'  File "{code.co_filename}", line {line}, in {code.co_name}'
    return f"{where}\n    {source}" if source else where


def pickle_function(fn: Callable[..., Any]) -> SerializedFunction:
    """``fn`` cloudpickled for ``RegisterFunction``, as ``schedule`` sends a plain callable.

    Raises ``TypeError`` for something that is not callable or cannot be pickled.
    """
    _check_callable(fn, "pickle_function()")
    return SerializedFunction.of(KIND_CLOUDPICKLE, _dumps(fn))


def export_function(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    platforms: Sequence[str] | None = None,
) -> SerializedFunction:
    """``fn`` exported with ``jax.export`` for arguments shaped like ``args``/``kwargs``, as
    ``schedule`` sends a ``jax.jit`` function (a plain function is jitted first).

    ``platforms`` defaults to this process's backend; give the workers' (e.g.
    ``["tpu"]``) when they differ. Raises ``TypeError`` for a non-array argument leaf.
    """
    _check_callable(fn, "export_function()")
    signature = _signature(args, dict(kwargs or {}))
    if isinstance(signature, str):
        raise TypeError(f"cannot export {getattr(fn, '__name__', fn)!r}: {signature}")
    if platforms is None:
        from jaxcluster.devices import export_platform

        platforms = (export_platform(),)
    return _export(fn, _specs(signature), platforms)


def _dumps(fn: Callable[..., Any]) -> bytes:
    try:
        return _source_code.dumps(fn)
    except Exception as exc:
        raise TypeError(
            f"cannot send {getattr(fn, '__qualname__', type(fn).__qualname__)} to the "
            f"workers: cloudpickle failed with {type(exc).__name__}: {exc}; expected a "
            "function or callable object whose captured values can be pickled"
        ) from exc
