"""The ps variables an optimizer keeps beside each variable: its slots and step counts.

One owner for their names and layout, used by ``Optimizer.build`` (which creates them),
by ``strategy.save`` (which finds those the ps created lazily, at a first update without
``build``) and by ``strategy.restore`` (which recreates those a checkpoint holds):

- a slot is ``<shard key>/<optimizer>/<slot>`` on each shard's ps task, with its parent's
  dtype, shape and shards, and is checkpointed whole as ``<variable>/<optimizer>/<slot>``;
- a step count is ``<shard key>/<optimizer>/iterations``, an int64 scalar on that shard's
  ps task, checkpointed under that key.

Example::

    found = on_ps(strategy.variables)     # slots and counts the ps holds, as variables
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxcluster.strategy.variables import ParameterServerVariable, Shard

__all__ = ["COUNT", "count_variable", "from_checkpoint", "on_ps", "slot_variable"]

#: The last name part of a step count.
COUNT = "iterations"


def slot_variable(
    parent: ParameterServerVariable, optimizer: str, slot: str
) -> ParameterServerVariable:
    """The slot ``slot`` of ``optimizer`` for ``parent``: partitioned as ``parent``."""
    shards = [s._replace(key=f"{s.key}/{optimizer}/{slot}") for s in parent.shards]
    return ParameterServerVariable(
        f"{parent.name}/{optimizer}/{slot}",
        parent.dtype,
        parent.shape,
        shards,
        auth_token=parent._token,
        tls_ca=parent._tls_ca,
        session=parent.session_id,
    )


def count_variable(
    parent: ParameterServerVariable, shard: Shard, optimizer: str
) -> ParameterServerVariable:
    """The step count of ``optimizer`` for ``parent``'s shard ``shard``."""
    key = f"{shard.key}/{optimizer}/{COUNT}"
    return ParameterServerVariable(
        key,
        np.int64,
        (),
        [shard._replace(key=key, start=0, stop=0)],
        auth_token=parent._token,
        tls_ca=parent._tls_ca,
        session=parent.session_id,
    )


def _suffixes(names: Iterable[str], prefix: str) -> set[tuple[str, str]]:
    """``(optimizer, slot)`` for every name ``<prefix>/<optimizer>/<slot>``."""
    found = set()
    for name in names:
        if name.startswith(prefix + "/"):
            parts = name[len(prefix) + 1 :].split("/")
            if len(parts) == 2 and all(parts):
                found.add((parts[0], parts[1]))
    return found


def on_ps(variables: Sequence[ParameterServerVariable]) -> list[ParameterServerVariable]:
    """The slots and step counts of ``variables`` that their ps tasks hold (one
    ``ListVariables`` per task), whether ``build`` made them or a first update did. A slot
    counts only when every shard of its parent has it."""
    first_shard: dict[int, tuple[ParameterServerVariable, Shard]] = {}
    for variable in variables:
        for shard in variable.shards:
            first_shard.setdefault(shard.task, (variable, shard))
    names: dict[int, set[str]] = defaultdict(set)
    for task, (variable, shard) in first_shard.items():
        names[task] = {entry["name"] for entry in variable._call(shard, "list_variables")}
    known = {v.name for v in variables}
    found: list[ParameterServerVariable] = []
    for variable in variables:
        per_shard = [_suffixes(names[s.task], s.key) for s in variable.shards]
        for shard, pairs in zip(variable.shards, per_shard, strict=True):
            for optimizer, _ in sorted(p for p in pairs if p[1] == COUNT):
                found.append(count_variable(variable, shard, optimizer))
        common = set.intersection(*per_shard) if per_shard else set()
        for optimizer, slot in sorted(p for p in common if p[1] != COUNT):
            found.append(slot_variable(variable, optimizer, slot))
    return [v for v in found if v.name not in known]


def from_checkpoint(
    variables: Sequence[ParameterServerVariable], arrays: Mapping[str, Any]
) -> list[ParameterServerVariable]:
    """The slots and step counts that ``arrays`` (a checkpoint's) holds for ``variables``
    and ``variables`` lacks: named as ``save`` names them, with the parent's dtype and
    shape (a slot) or int64 scalars (a count). Anything else is left for restore to reject."""
    known = {v.name for v in variables}
    extra = [name for name in arrays if name not in known]
    found: list[ParameterServerVariable] = []
    for variable in variables:
        for optimizer, slot in sorted(_suffixes(extra, variable.name)):
            if slot != COUNT:
                found.append(slot_variable(variable, optimizer, slot))
        for shard in variable.shards:
            for optimizer, slot in sorted(_suffixes(extra, shard.key)):
                if slot == COUNT:
                    found.append(count_variable(variable, shard, optimizer))
    unique: dict[str, ParameterServerVariable] = {}
    for made in found:
        unique.setdefault(made.name, made)
    return list(unique.values())
