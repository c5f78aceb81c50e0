"""Mapping a function over the leaves of nested tuples, lists and dicts, and of any
container JAX knows as a pytree node.

What ``ClusterCoordinator.fetch`` and dataflow (``RemoteValue`` arguments) use: containers
keep their type (named tuples and dict subclasses included where they can be rebuilt),
``None`` and every other object is a leaf. Once ``jax`` is imported, a node registered with
``jax.tree_util`` (a ``register_dataclass`` class, a flax struct, ...) is a container too,
rebuilt through its own unflatten; ``jax`` is never imported here.

Example::

    map_structure(lambda x: x * 2, {"a": (1, [2, None])})   # {'a': (2, [4, None])}
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["map_structure"]


#: Types that are leaves for JAX too: no pytree lookup for them.
_PLAIN_LEAVES = (bool, int, float, complex, str, bytes, bytearray, memoryview)
#: Types JAX flattened to themselves: leaves (registration comes with a class's definition,
#: before its instances exist, so a leaf type stays a leaf).
_leaf_types: set[type] = set()


def _pytree_node(value: Any) -> tuple[list[Any], Callable[[list[Any]], Any]] | None:
    """``value``'s children and how to rebuild it when JAX registered its type as a pytree
    node (with ``jax`` already imported); ``None`` for a leaf."""
    jax = sys.modules.get("jax")
    kind = type(value)
    if jax is None or isinstance(value, _PLAIN_LEAVES) or kind in _leaf_types:
        return None
    tree_util = jax.tree_util
    try:
        children, treedef = tree_util.tree_flatten(value, is_leaf=lambda x: x is not value)
    except Exception:
        return None
    if tree_util.treedef_is_leaf(treedef):
        _leaf_types.add(kind)
        return None
    return children, treedef.unflatten


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
    node = _pytree_node(value)
    if node is not None:
        children, rebuild = node
        return rebuild([map_structure(fn, child) for child in children])
    return fn(value)
