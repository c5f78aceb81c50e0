"""Variable partitioners: how many shards (along axis 0) a large variable is split into.

Same names, arguments and arithmetic as TF's ``tf.distribute.experimental.partitioners``.
A partitioner is called as ``partitioner(shape, dtype, axis=0)`` and returns a list with
one shard count per axis (1 everywhere except ``axis``); any callable following that
protocol can be given to :class:`~jaxcluster.ParameterServerStrategy` as
``variable_partitioner``. Shards are placed on ps tasks round-robin, like whole variables.

Example::

    strategy = ParameterServerStrategy(
        resolver, variable_partitioner=MinSizePartitioner(min_shard_bytes=1 << 20, max_shards=4)
    )
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "Partitioner",
]


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r}; expected a positive integer")
    return int(value)


def _check_axis(shape: Sequence[int], axis: int) -> None:
    if not 0 <= axis < len(shape):
        raise ValueError(
            f"cannot partition a variable of shape {tuple(shape)} along axis {axis}; "
            f"expected an axis in [0, {len(shape)})"
        )


class Partitioner:
    """Base class: ``__call__(shape, dtype, axis=0)`` returns shards per axis."""

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        raise NotImplementedError


class FixedShardsPartitioner(Partitioner):
    """``num_shards`` shards, or one per row if the axis is shorter.

    Example::

        >>> FixedShardsPartitioner(2)((10, 3), "float32")
        [2, 1]
    """

    def __init__(self, num_shards: int) -> None:
        self._num_shards = _positive_int(num_shards, "num_shards")

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        _check_axis(shape, axis)
        result = [1] * len(shape)
        result[axis] = max(1, min(self._num_shards, int(shape[axis])))
        return result


class MinSizePartitioner(Partitioner):
    """As many shards as keep each at least ``min_shard_bytes``, at most ``max_shards``.

    Example::

        >>> MinSizePartitioner(min_shard_bytes=4, max_shards=2)((6, 1), "float32")
        [2, 1]
    """

    def __init__(
        self, min_shard_bytes: int = 256 << 10, max_shards: int = 1, bytes_per_string: int = 16
    ) -> None:
        self._min_shard_bytes = _positive_int(min_shard_bytes, "min_shard_bytes")
        self._max_shards = _positive_int(max_shards, "max_shards")
        self._bytes_per_string = _positive_int(bytes_per_string, "bytes_per_string")

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        _check_axis(shape, axis)
        total = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
        result = [1] * len(shape)
        wanted = math.ceil(total / self._min_shard_bytes)
        result[axis] = max(1, min(int(shape[axis]), self._max_shards, wanted))
        return result


class MaxSizePartitioner(Partitioner):
    """As few shards as keep each at most ``max_shard_bytes`` (but at least one row each),
    at most ``max_shards`` when given.

    Example::

        >>> MaxSizePartitioner(max_shard_bytes=8)((6, 1), "float32")
        [3, 1]
    """

    def __init__(
        self, max_shard_bytes: int, max_shards: int | None = None, bytes_per_string: int = 16
    ) -> None:
        self._max_shard_bytes = _positive_int(max_shard_bytes, "max_shard_bytes")
        self._max_shards = None if max_shards is None else _positive_int(max_shards, "max_shards")
        self._bytes_per_string = _positive_int(bytes_per_string, "bytes_per_string")

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        _check_axis(shape, axis)
        row_bytes = np.dtype(dtype).itemsize * math.prod(
            int(d) for i, d in enumerate(shape) if i != axis
        )
        rows_per_shard = max(1, self._max_shard_bytes // max(1, row_bytes))
        shards = math.ceil(int(shape[axis]) / rows_per_shard)
        if self._max_shards is not None:
            shards = min(self._max_shards, shards)
        result = [1] * len(shape)
        result[axis] = max(1, shards)
        return result
