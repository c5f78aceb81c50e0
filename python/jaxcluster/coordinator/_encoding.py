"""Encoding a closure's arguments: per-worker placeholders and the RemoteValue check.

While :func:`encode_args` pickles ``(args, kwargs)``, a thread-local context is active. A
``PerWorkerValues`` met anywhere in the arguments pickles as ``resolved(ResourceRef(id))``:
``wire`` turns the ``ResourceRef`` into a persistent id that the executing worker replaces
with its own element, and :func:`resolved` hands that element to the closure. The context
collects the resources so the dispatcher can make sure they exist on that worker first. A
``RemoteValue`` met while pickling (inside an object other than a tuple, list or dict, where
dataflow does not look) makes the call fail with ``ValueError``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxcluster import wire

__all__ = ["encode_args", "placeholder", "reject_remote_value", "resolved"]

_local = threading.local()


class _Context:
    def __init__(self, resource_for: Callable[[Any], Any]) -> None:
        self.resource_for = resource_for
        self.resources: list[Any] = []
        self._ids: set[int] = set()
        self.remote_value: Any = None

    def add(self, resource: Any) -> int:
        resource_id = int(resource.resource_id)
        if resource_id not in self._ids:  # a second pickling attempt meets it again
            self._ids.add(resource_id)
            self.resources.append(resource)
        return resource_id


def _current() -> _Context | None:
    return getattr(_local, "context", None)


def resolved(value: Any) -> Any:
    """Runs on the worker: the per-worker element a placeholder stood for."""
    return value


def placeholder(per_worker_values: Any) -> tuple[Any, tuple[Any, ...]]:
    """The ``__reduce__`` value of a ``PerWorkerValues`` being sent as an argument."""
    context = _current()
    if context is None:
        raise TypeError(
            "a PerWorkerValues can only be sent as an argument of "
            "ClusterCoordinator.schedule (each worker then receives its own element); it "
            "cannot be pickled on its own"
        )
    resource = context.resource_for(per_worker_values)
    return resolved, (wire.ResourceRef(context.add(resource)),)


def reject_remote_value(remote_value: Any) -> None:
    """Called when a ``RemoteValue`` is being pickled; raises inside :func:`encode_args`."""
    context = _current()
    if context is not None:
        context.remote_value = remote_value
        raise ValueError(_REMOTE_VALUE_MESSAGE)


_REMOTE_VALUE_MESSAGE = (
    "a RemoteValue was passed as an argument of schedule() inside an object that is not a "
    "tuple, list, dict or registered JAX pytree node; a closure takes another closure's "
    "result only as a leaf of those containers in args/kwargs. Put it there (or register "
    "the class with jax.tree_util), or .fetch() it and pass the value instead"
)


def encode_args(
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    resource_for: Callable[[Any], Any],
) -> tuple[wire.EncodedValue, list[Any]]:
    """Pickles ``(args, kwargs)``; returns the encoding and the per-worker resources used.

    ``resource_for(per_worker_values)`` returns the dispatcher's resource handle for a
    ``PerWorkerValues`` met in the arguments.
    """
    value = (tuple(args), dict(kwargs))
    context = _Context(resource_for)
    previous = _current()
    _local.context = context
    try:
        try:
            encoded = wire.fast_encode(value, zero_copy=True)
        except Exception:
            if context.remote_value is not None:
                raise
            encoded = None  # lambdas, local classes...: wire.encode falls back to cloudpickle
        if encoded is None or context.resources:
            # Placeholders must become persistent ids, which only wire's pickler makes.
            encoded = wire.encode(value, zero_copy=True)
    except Exception as exc:
        if context.remote_value is not None:
            raise ValueError(_REMOTE_VALUE_MESSAGE) from None
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        if isinstance(cause, (ValueError, TypeError)) and "PerWorkerValues" in str(cause):
            raise cause from None
        raise
    finally:
        _local.context = previous
    if context.remote_value is not None:  # swallowed by a custom __reduce__ somewhere
        raise ValueError(_REMOTE_VALUE_MESSAGE)
    return encoded, context.resources
