"""Saving and restoring a strategy's variables through the checkpoint file.

Save reads every shard with one ``ReadMany`` per ps task (each shard read atomically),
reassembles sharded variables, and writes them by their strategy names, so a checkpoint
restores into any number of ps tasks and any partitioning. Restore validates the whole file
and every name, dtype and shape before the first write, then sends one all-or-nothing
``AssignMany`` per ps task (creating variables a restarted ps lost).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxcluster.strategy.checkpoint import read_checkpoint, write_checkpoint
from jaxcluster.strategy.variables import ParameterServerVariable, Shard

__all__ = ["restore", "save"]


def _by_task(
    variables: Sequence[ParameterServerVariable],
) -> dict[int, list[tuple[ParameterServerVariable, Shard]]]:
    grouped: dict[int, list[tuple[ParameterServerVariable, Shard]]] = defaultdict(list)
    for variable in variables:
        for shard in variable.shards:
            grouped[shard.task].append((variable, shard))
    return grouped


def save(variables: Sequence[ParameterServerVariable], path: str | os.PathLike[str]) -> None:
    pieces: dict[tuple[int, str], np.ndarray] = {}
    for task, items in _by_task(variables).items():
        variable, first = items[0]
        keys = [shard.key for _, shard in items]
        values = variable._call(first, "read_many", keys)
        for key in keys:
            pieces[(task, key)] = values[key]
    arrays: dict[str, Any] = {}
    for variable in variables:
        parts = [pieces[(s.task, s.key)] for s in variable.shards]
        arrays[variable.name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    write_checkpoint(path, arrays)


def _mismatches(
    variables: Sequence[ParameterServerVariable], arrays: dict[str, np.ndarray]
) -> list[str]:
    problems = []
    names = {v.name for v in variables}
    for variable in variables:
        found = arrays.get(variable.name)
        if found is None:
            problems.append(f"variable {variable.name!r} is not in the checkpoint")
        elif found.dtype != variable.storage_dtype or found.shape != variable.shape:
            problems.append(
                f"variable {variable.name!r} is "
                f"{variable.storage_dtype.name}{list(variable.shape)} "
                f"but the checkpoint holds {found.dtype.name}{list(found.shape)}"
            )
    extra = sorted(set(arrays) - names)
    if extra:
        problems.append(f"the checkpoint holds variables this strategy lacks: {extra}")
    return problems


def restore(
    variables: Sequence[ParameterServerVariable],
    path: str | os.PathLike[str],
    arrays: dict[str, np.ndarray] | None = None,
) -> None:
    """Sets ``variables`` from the checkpoint at ``path`` (``arrays``: its contents, when
    the caller has read it already)."""
    if arrays is None:
        arrays = read_checkpoint(path)
    problems = _mismatches(variables, arrays)
    if problems:
        raise ValueError(
            f"checkpoint {os.fspath(path)!r} does not match this strategy's variables, so "
            f"nothing was restored: {'; '.join(problems)}"
        )
    for items in _by_task(variables).values():
        payload = []
        for variable, shard in items:
            whole = arrays[variable.name]
            part = whole if len(variable.shards) == 1 else whole[shard.start : shard.stop]
            payload.append((shard.key, part))
        variable, first = items[0]
        variable._call(first, "assign_many", payload, create_missing=True)
