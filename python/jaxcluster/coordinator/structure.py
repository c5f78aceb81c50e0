"""Mapping a function over the leaves of nested tuples, lists and dicts.

What ``ClusterCoordinator.fetch`` uses: containers keep their type (named tuples and dict
subclasses included where they can be rebuilt), ``None`` and every other object is a leaf.

Example::

    map_structure(lambda x: x * 2, {"a": (1, [2, None])})   # {'a': (2, [4, None])}
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

__all__ = ["map_structure"]


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    """``value`` rebuilt with ``fn`` applied to each leaf (``None`` is passed through)."""
    if value is None:
        return None
    kind = type(value)
    if kind is list:
        return [map_structure(fn, v) for v in value]
    if kind is tuple:
        return tuple(map_structure(fn, v) for v in value)
    if kind is dict:
        return {k: map_structure(fn, v) for k, v in value.items()}
    if _is_namedtuple(value):
        return kind(*(map_structure(fn, v) for v in value))
    if isinstance(value, dict):
        items = [(k, map_structure(fn, v)) for k, v in value.items()]
        try:
            rebuilt = copy.copy(value)  # keeps e.g. a defaultdict's factory
            rebuilt.clear()
            rebuilt.update(items)
            return rebuilt
        except Exception:
            return dict(items)
    if isinstance(value, (list, tuple)):
        mapped = [map_structure(fn, v) for v in value]
        try:
            return kind(mapped)
        except Exception:
            return list(mapped) if isinstance(value, list) else tuple(mapped)
    return fn(value)
