"""Variables that live on parameter servers, and the proxies closures use.

A :class:`ParameterServerVariable` is a name, a dtype, a shape and a shard layout: which
ps task holds which rows under which key. It holds no value locally. Every operation is
one RPC per shard, made with the GIL released; an update to one shard is atomic on its ps.
Pickled (e.g. captured by a scheduled closure) it carries only that layout and its
strategy's session id, never a token: a worker that unpickles it authenticates with its own
token, calls in the strategy's session (so it sees that strategy's variables and no
other's), and shares one connection per ps task and session with every other variable in
the process.

Inside ``jax.jit`` (or any staged trace: ``jax.export``, ``jax.eval_shape``) a variable
works as in a ``tf.function``: ``read_value()`` and the ``assign*`` methods become ordered
``jax.experimental.io_callback``s that run every time the compiled function runs, in program
order, instead of once at trace time (where a read would be baked in as a constant and an
update would happen once). Such a function cannot be exported (``jax.export`` refuses host
callbacks), so ``schedule`` sends it cloudpickled and each worker compiles it. The faster
pattern, when a step only needs the value: read outside the jitted function and pass it in.

Example::

    with strategy.scope():
        v = strategy.Variable(0.0)
    v.assign_add(0.5)
    v.read_value()          # array(0.5, dtype=float32)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxcluster import errors
from jaxcluster.strategy import _clients

__all__ = ["ParameterServerVariable", "Shard"]


class Shard(NamedTuple):
    """Rows ``[start, stop)`` of a variable (all of it for a scalar), held by ps task
    ``task`` at ``address`` under ``key``."""

    task: int
    address: str
    key: str
    start: int
    stop: int


def _describe(dtype: np.dtype[Any], shape: tuple[int, ...]) -> str:
    return f"{dtype.name}[{', '.join(str(d) for d in shape)}]"


def _staging() -> Any:
    """The ``jax`` module when this call runs inside a staged trace (``jit``, ``export``,
    ``eval_shape``; also a ``grad`` or ``vmap`` under one), else ``None``.

    Eager ``grad``/``vmap`` do not stage: their values are concrete, so a plain RPC is
    right there. JAX has no public test for "a jit trace is active"; this walks its trace
    stack (private, checked against the JAX versions CI runs) and answers ``None`` when the
    internals are not there.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        from jax._src import core
        from jax._src.interpreters.partial_eval import DynamicJaxprTrace

        trace = core.trace_ctx.trace
    except (ImportError, AttributeError):
        return None
    while trace is not None:
        if isinstance(trace, DynamicJaxprTrace):
            return jax
        trace = getattr(trace, "parent_trace", None)
    return None


def _host_callback(jax: Any, fn: Callable[..., Any], result: Any, *args: Any) -> Any:
    """``fn(*args)`` as an ordered ``io_callback``: runs each time the compiled function
    does, in program order with the other variable operations."""
    from jax.experimental import io_callback

    return io_callback(fn, result, *args, ordered=True)


class ParameterServerVariable:
    """A variable on parameter servers (possibly sharded along axis 0).

    Made by :meth:`ParameterServerStrategy.Variable`; usable on the coordinator and inside
    closures on workers. Values given to ``assign*`` may be numpy arrays, JAX arrays or
    Python numbers; they must have the variable's shape and are converted to its dtype when
    that keeps their kind (``float64`` → ``float32`` yes, ``float`` → ``int`` no).
    """

    def __init__(
        self,
        name: str,
        dtype: Any,
        shape: Sequence[int],
        shards: Sequence[Shard],
        *,
        auth_token: str | None = None,
        tls_ca: bytes | None = None,
        session: str | None = None,
    ) -> None:
        self._name = name
        self._session = session
        # Shard keys, and slot and step-count keys, adopted by a re-attaching strategy.
        self._reattached: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        self._dtype = np.dtype(dtype)
        # The ps store keeps numbers; a bool variable travels and rests as uint8 0/1.
        self._storage = np.dtype(np.uint8) if self._dtype == np.bool_ else self._dtype
        self._shape = tuple(int(d) for d in shape)
        self._shards = tuple(Shard(*s) for s in shards)
        self._token = auth_token if auth_token is not None else _clients.default_token()
        self._tls_ca = tls_ca if tls_ca is not None else _clients.default_tls_ca()

    # -- identity ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The variable's name (its key in checkpoints)."""
        return self._name

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type, as a numpy dtype."""
        return self._dtype

    @property
    def storage_dtype(self) -> np.dtype[Any]:
        """The dtype the ps tasks (and checkpoints) hold: ``uint8`` for a bool variable,
        else :attr:`dtype`."""
        return self._storage

    @property
    def shape(self) -> tuple[int, ...]:
        """Dimensions; ``()`` for a scalar."""
        return self._shape

    @property
    def session_id(self) -> str | None:
        """The session (its strategy's :attr:`~ParameterServerStrategy.session_id`) the
        variable belongs to on the ps tasks; ``None``: the anonymous session."""
        return self._session

    @property
    def reattached(self) -> bool:
        """Whether every shard was adopted alive from the ps by a strategy made with
        ``reattach=True`` (keeping its value) rather than created from its initial value."""
        return len(self._reattached[0]) == len(self._shards)

    def _mark_reattached(self, shards: frozenset[str], slots: frozenset[str]) -> None:
        self._reattached = (shards, slots)

    def _adopted(self, key: str) -> bool:
        """Whether the ps key ``key`` (a shard's, or a slot's or step count's) was adopted
        alive, so that building it anew would lose its value."""
        return key in self._reattached[0] or key in self._reattached[1]

    @property
    def shards(self) -> tuple[Shard, ...]:
        """Where the variable lives: one :class:`Shard` per piece, in row order."""
        return self._shards

    def __reduce__(self) -> tuple[Any, ...]:
        # Layout and session only; the unpickling process supplies its own token and CA.
        return (
            _rebuild,
            (
                self._name,
                self._dtype.str,
                self._dtype.name,
                self._shape,
                tuple(tuple(s) for s in self._shards),
                self._session,
            ),
        )

    def __repr__(self) -> str:
        where = ", ".join(f"ps:{s.task}" for s in self._shards)
        return (
            f"<ParameterServerVariable {self._name!r} {_describe(self._dtype, self._shape)} "
            f"on {where}>"
        )

    # -- RPC plumbing --------------------------------------------------------------------

    def _call(self, shard: Shard, method: str, *args: Any, **kwargs: Any) -> Any:
        """Calls ``PsClient.<method>(*args, **kwargs)`` on ``shard``'s ps task; an
        unreachable or restarted ps becomes a ``PSUnavailableError`` naming the task (by
        the RPC's status code)."""
        client = _clients.client_for(shard.address, self._token, self._tls_ca, self._session)
        try:
            return getattr(client, method)(*args, **kwargs)
        except errors.PSUnavailableError:
            raise
        except errors.UnavailableError as exc:
            raise errors.PSUnavailableError(shard.task, shard.address, exc) from exc
        except errors.NotFoundError as exc:
            detail = (
                f"it no longer holds {shard.key!r} (part of variable {self._name!r}) for "
                f"this session: the ps restarted and lost its variables (restore them from "
                f"a checkpoint), or this session was released (its strategy shut down, or "
                f"vanished past --state-ttl), or a strategy with reattach=True took the "
                f"variable over ({exc})"
            )
            raise errors.PSUnavailableError(shard.task, shard.address, exc, detail) from exc

    def _coerce(self, value: Any, op: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """``value`` as an array of this variable's dtype and ``shape`` (its own by
        default); ``TypeError``/``ValueError`` saying what was wrong otherwise."""
        array = np.asarray(value)
        want = self._shape if shape is None else shape
        if array.dtype != self._dtype:
            if array.dtype.kind not in "biuf" or not np.can_cast(
                array.dtype, self._dtype, casting="same_kind"
            ):
                raise TypeError(
                    f"{op} to variable {self._name!r} ({_describe(self._dtype, self._shape)}) "
                    f"got a {array.dtype.name} value; expected {self._dtype.name} or a type "
                    f"that converts to it without changing kind (e.g. float64 -> float32)"
                )
            array = array.astype(self._dtype)
        if array.shape != want:
            raise ValueError(
                f"{op} to variable {self._name!r} ({_describe(self._dtype, self._shape)}) got "
                f"a value of shape {array.shape}; expected shape {want} (values are not "
                "broadcast)"
            )
        return array

    def _check_traced(self, jax: Any, op: str, value: Any) -> None:
        """Shape and dtype kind of a traced ``value``, checked at trace time (a wrong one
        would otherwise fail inside the callback, at run time)."""
        shape, dtype = jax.numpy.shape(value), np.dtype(jax.numpy.result_type(value))
        self._coerce(np.zeros(shape, dtype), op)

    def _piece(self, array: np.ndarray, shard: Shard) -> np.ndarray:
        return array if len(self._shards) == 1 else array[shard.start : shard.stop]

    def _check_arithmetic(self, op: str) -> None:
        if self._dtype == np.bool_:
            raise TypeError(
                f"{op} on bool variable {self._name!r}: a bool variable can only be assigned "
                "(as in TF); keep a count in an int32 variable instead"
            )

    def _update(self, method: str, value: Any, read_value: bool) -> ParameterServerVariable | None:
        if method != "assign":
            self._check_arithmetic(method)
        jax = _staging()
        if jax is not None:
            self._check_traced(jax, method, value)
            _host_callback(jax, lambda v: self._update(method, v, False), None, value)
            return self if read_value else None
        array = self._coerce(value, method).astype(self._storage, copy=False)
        for shard in self._shards:
            piece = self._piece(array, shard)
            self._call(shard, method, shard.key, piece)
        return self if read_value else None

    # -- the TF Variable API -------------------------------------------------------------

    def read_value(self) -> np.ndarray:
        """The current value, as a new writable numpy array. Each shard is read atomically;
        shards of one variable are read one after another. Inside ``jax.jit``: a JAX array
        read when the compiled function runs (see the module documentation)."""
        jax = _staging()
        if jax is not None:
            spec = jax.ShapeDtypeStruct(self._shape, jax.dtypes.canonicalize_dtype(self._dtype))
            return _host_callback(  # type: ignore[no-any-return]
                jax, lambda: np.asarray(self.read_value(), dtype=spec.dtype), spec
            )
        pieces = [self._call(s, "read", s.key) for s in self._shards]
        value = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)
        return value.astype(np.bool_) if self._dtype == np.bool_ else value

    def value(self) -> np.ndarray:
        """Same as :meth:`read_value`."""
        return self.read_value()

    def numpy(self) -> np.ndarray:
        """Same as :meth:`read_value` (TF's eager spelling)."""
        return self.read_value()

    def __jax_array__(self) -> Any:
        """``jnp.asarray(variable)`` and JAX operations on it read its value (inside
        ``jax.jit`` too, when the compiled function runs)."""
        return self.read_value()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        value = self.read_value()
        return value if dtype is None else value.astype(dtype)

    def assign(
        self,
        value: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> ParameterServerVariable | None:
        """``variable = value``. Returns this variable (read lazily, like TF's), or
        ``None`` with ``read_value=False``."""
        return self._update("assign", value, read_value)

    def assign_add(
        self,
        delta: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> ParameterServerVariable | None:
        """``variable += delta``, atomically per shard: concurrent calls never lose an
        update. Returns this variable, or ``None`` with ``read_value=False``."""
        return self._update("assign_add", delta, read_value)

    def assign_sub(
        self,
        delta: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> ParameterServerVariable | None:
        """``variable -= delta``, atomically per shard. Returns this variable, or ``None``
        with ``read_value=False``."""
        return self._update("assign_sub", delta, read_value)

    def scatter_add(
        self, sparse_delta: Any = None, indices: Any = None, updates: Any = None
    ) -> ParameterServerVariable:
        """``variable[indices[i], ...] += updates[i, ...]`` (repeated rows add up).

        Give ``indices`` and ``updates``, or one object with ``.indices`` and ``.values``
        (like TF's ``IndexedSlices``) as ``sparse_delta``. ``indices`` may have any shape;
        ``updates`` then has shape ``indices.shape + variable.shape[1:]``.
        """
        self._check_arithmetic("scatter_add")
        if sparse_delta is not None:
            indices, updates = sparse_delta.indices, sparse_delta.values
        if indices is None or updates is None:
            raise TypeError("scatter_add needs indices and updates (or an IndexedSlices-like)")
        if not self._shape:
            raise ValueError(
                f"scatter_add to scalar variable {self._name!r}: a scalar has no rows; use "
                "assign_add"
            )
        jax = _staging()
        if jax is not None:
            _host_callback(
                jax, lambda i, u: self.scatter_add(indices=i, updates=u), None, indices, updates
            )
            return self
        index_array = np.asarray(indices)
        if index_array.size and index_array.dtype.kind not in "iu":
            raise TypeError(
                f"scatter_add to {self._name!r}: indices have dtype {index_array.dtype.name}; "
                "expected integers (row numbers along axis 0)"
            )
        flat = index_array.astype(np.int64).reshape(-1)
        rows = self._shape[0]
        bad = np.flatnonzero((flat < 0) | (flat >= rows))
        if bad.size:
            raise ValueError(
                f"scatter_add to {self._name!r} ({_describe(self._dtype, self._shape)}): index "
                f"{int(flat[bad[0]])} is out of range; expected 0 <= index < {rows}"
            )
        shaped = self._coerce(updates, "scatter_add", index_array.shape + self._shape[1:])
        rows_of_updates = shaped.reshape((flat.size, *self._shape[1:]))
        for shard in self._shards:
            mask = (flat >= shard.start) & (flat < shard.stop)
            if not mask.any():
                continue
            local, part = flat[mask] - shard.start, rows_of_updates[mask]
            self._call(shard, "scatter_add", shard.key, local, part)
        return self


def _rebuild(
    name: str,
    dtype_str: str,
    dtype_name: str,
    shape: tuple[int, ...],
    shards: tuple[Any, ...],
    session: str | None = None,
) -> ParameterServerVariable:
    dtype: Any = dtype_str
    if dtype_name == "bfloat16":  # numpy cannot name it; ml_dtypes (with JAX) can
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    return ParameterServerVariable(name, dtype, shape, [Shard(*s) for s in shards], session=session)
