"""Turns registered function payloads into callables, cached by content hash."""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["FunctionCache", "FunctionLoadError"]


class FunctionLoadError(Exception):
    """A registered payload could not be made into a callable on this worker.

    ``__cause__`` holds the underlying error (e.g. ``ModuleNotFoundError``).
    """


def _load_cloudpickle(payload: bytes) -> Callable[..., Any]:
    try:
        fn = pickle.loads(payload)
    except Exception as exc:
        raise FunctionLoadError(
            f"the function payload ({len(payload)} bytes) could not be unpickled on this "
            f"worker: {type(exc).__name__}: {exc}. Is every module it uses installed here?"
        ) from exc
    if not callable(fn):
        raise FunctionLoadError(
            f"the function payload unpickled to a {type(fn).__qualname__}, which is not "
            "callable; expected a function or callable object"
        )
    return fn  # type: ignore[no-any-return]


def _load_jax_export(payload: bytes) -> Callable[..., Any]:
    try:
        import jax
        from jax import export

        exported = export.deserialize(bytearray(payload))
    except Exception as exc:
        raise FunctionLoadError(
            f"the jax.export payload ({len(payload)} bytes) could not be deserialized on "
            f"this worker: {type(exc).__name__}: {exc}"
        ) from exc
    platform = jax.default_backend()
    if platform not in exported.platforms:
        raise FunctionLoadError(
            f"the function was exported for platforms {list(exported.platforms)} but this "
            f"worker runs on {platform!r}; export it with platforms=[{platform!r}]"
        )
    return exported.call  # type: ignore[no-any-return]


_LOADERS: dict[str, Callable[[bytes], Callable[..., Any]]] = {
    "cloudpickle": _load_cloudpickle,
    "jax_export": _load_jax_export,
}


class FunctionCache:
    """Callables by function hash; each payload is loaded once per worker process while it
    stays in the cache.

    The cache keeps the ``max_entries`` most recently used callables whose payloads add up
    to at most ``max_bytes`` (a loaded function holds what its payload held: a closure
    capturing a large array is as large loaded as pickled), evicting the least recently
    used, as the server's function store does; an evicted function is loaded again from
    its payload when a closure needs it.

    Example::

        cache = FunctionCache()
        fn = cache.get(job.function_hash, job.function_kind, lambda: job.function_payload)
    """

    def __init__(self, max_entries: int = 512, max_bytes: int = 1024**3) -> None:
        self._functions: OrderedDict[bytes, tuple[Callable[..., Any], int]] = OrderedDict()
        self._bytes = 0
        self._max_entries = max_entries
        self._max_bytes = max_bytes

    def get(
        self, function_hash: bytes, kind: str, payload: Callable[[], bytes]
    ) -> Callable[..., Any]:
        """The callable for ``function_hash``; ``payload()`` is only read on a miss.

        Raises :class:`FunctionLoadError`; failures are not cached, so a later call retries.
        """
        found = self._functions.get(function_hash)
        if found is not None:
            self._functions.move_to_end(function_hash)
            return found[0]
        loader = _LOADERS.get(kind)
        if loader is None:
            raise FunctionLoadError(
                f"function kind {kind!r} is not supported; expected one of {sorted(_LOADERS)}"
            )
        data = payload()
        fn = loader(data)
        size = len(data)
        while self._functions and (
            len(self._functions) >= self._max_entries or self._bytes + size > self._max_bytes
        ):
            _, (_, evicted) = self._functions.popitem(last=False)
            self._bytes -= evicted
        self._functions[function_hash] = (fn, size)
        self._bytes += size
        return fn

    def __len__(self) -> int:
        return len(self._functions)
