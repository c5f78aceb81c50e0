"""Which node, and which slot on it, each task of a Slurm step runs on.

``srun`` places a step's tasks by its ``--distribution`` (``-m``), which it reports in
``SLURM_DISTRIBUTION`` when one was asked for (no variable means ``block``). Given how many
tasks each node got (``SLURM_STEP_TASKS_PER_NODE``), the node-level part of the method fixes
every rank's node:

- ``block``: node by node, each filled before the next;
- ``cyclic``: one task per node in turn, skipping nodes that have all of theirs;
- ``plane=N`` (size also in ``SLURM_DIST_PLANESIZE``): ``N`` consecutive tasks per node in
  turn, skipping nodes that have all of theirs.

``arbitrary`` takes the placement from a host file that the tasks never see, so it cannot
be computed: it is refused rather than guessed. A task's local index (its port offset) is
its position among the ranks of its node, which is what Slurm calls ``SLURM_LOCALID``.

Every task also knows where Slurm really put it (``SLURMD_NODENAME``, ``SLURM_LOCALID`` and
the ranks of its node, ``SLURM_GTIDS``); :func:`check_placement` compares them with the
computed placement, so a layout this module gets wrong fails loudly instead of producing a
cluster spec whose addresses are someone else's.

Example::

    >>> place({"n1": 2, "n2": 2, "n3": 1}, Distribution("cyclic"))
    [('n1', 0), ('n2', 0), ('n3', 0), ('n1', 1), ('n2', 1)]
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DISTRIBUTION_ENV",
    "PLANE_SIZE_ENV",
    "Distribution",
    "check_placement",
    "distribution_from_env",
    "place",
]

DISTRIBUTION_ENV = "SLURM_DISTRIBUTION"
PLANE_SIZE_ENV = "SLURM_DIST_PLANESIZE"
NODENAME_ENV = "SLURMD_NODENAME"
LOCALID_ENV = "SLURM_LOCALID"
GTIDS_ENV = "SLURM_GTIDS"

_METHODS = ("block", "cyclic", "plane")
_EXPECTED = "expected block, cyclic or plane[=N] (optionally with ':<socket method>' after it)"


@dataclass(frozen=True)
class Distribution:
    """How ranks go to nodes: ``method`` is ``block``, ``cyclic`` or ``plane``."""

    method: str = "block"
    plane_size: int = 0

    def __str__(self) -> str:
        return f"plane={self.plane_size}" if self.method == "plane" else self.method


def _plane_size(text: str, origin: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{origin} is {text!r}; expected a plane size of 1 or more")
    return int(text)


def distribution_from_env() -> Distribution:
    """The node-level distribution of this step, from ``SLURM_DISTRIBUTION``.

    ``ValueError`` naming ``--distribution`` for ``arbitrary`` and for anything unknown.
    """
    raw = os.environ.get(DISTRIBUTION_ENV, "").strip()
    # "block:cyclic,Pack": the part before ':' places tasks on nodes; what follows places
    # them on sockets and cores within a node, which does not change their addresses.
    node_level = raw.split(",", 1)[0].split(":", 1)[0].strip().lower()
    if node_level in ("", "*", "unknown"):
        return Distribution("block")
    if node_level == "arbitrary":
        raise ValueError(
            f"{DISTRIBUTION_ENV} is {raw!r}: this step was launched with "
            "srun --distribution=arbitrary, which places tasks from a host file no task "
            "sees, so the cluster spec cannot be computed. Launch with --distribution=block, "
            "cyclic or plane=N, or list the tasks yourself (JAXCLUSTER_WORKERS or TF_CONFIG)"
        )
    method, _, size = node_level.partition("=")
    if method not in _METHODS or (size and method != "plane"):
        raise ValueError(
            f"{DISTRIBUTION_ENV} is {raw!r} (srun --distribution); its node-level method "
            f"{node_level!r} is not one the resolver can compute; {_EXPECTED}"
        )
    if method != "plane":
        return Distribution(method)
    if size:
        return Distribution("plane", _plane_size(size, f"the plane size in {DISTRIBUTION_ENV}"))
    raw_size = os.environ.get(PLANE_SIZE_ENV)
    if raw_size is None:
        raise ValueError(
            f"{DISTRIBUTION_ENV} is {raw!r} but {PLANE_SIZE_ENV} is not set; expected the "
            "plane size srun --distribution=plane=N sets there"
        )
    return Distribution("plane", _plane_size(raw_size, PLANE_SIZE_ENV))


def place(counts: Mapping[str, int], distribution: Distribution) -> list[tuple[str, int]]:
    """``(node, local index)`` of every rank, for ``counts`` tasks per node (in node order)."""
    if distribution.method == "block":
        return [(node, local) for node, count in counts.items() for local in range(count)]
    chunk = 1 if distribution.method == "cyclic" else distribution.plane_size
    placed = dict.fromkeys(counts, 0)
    total = sum(counts.values())
    layout: list[tuple[str, int]] = []
    while len(layout) < total:
        for node, count in counts.items():
            take = min(chunk, count - placed[node])
            layout.extend((node, placed[node] + i) for i in range(take))
            placed[node] += take
    return layout


def _ids(raw: str) -> list[int] | None:
    parts = [part.strip() for part in raw.split(",")]
    return [int(part) for part in parts] if all(p.isdigit() for p in parts) else None


def check_placement(layout: list[tuple[str, int]], rank: int, how: str) -> None:
    """``ValueError`` when Slurm's own view of this task (``SLURMD_NODENAME``,
    ``SLURM_LOCALID``, ``SLURM_GTIDS``, where set) differs from ``layout[rank]``.

    ``how`` says what the layout was computed from, for the message.
    """
    node, local = layout[rank]
    computed_ranks = [r for r, (n, _) in enumerate(layout) if n == node]
    seen: list[str] = []
    expected: list[str] = []
    actual_node = os.environ.get(NODENAME_ENV)
    if actual_node is not None and actual_node != node:
        seen.append(f"{NODENAME_ENV}={actual_node}")
        expected.append(f"node {node}")
    actual_local = os.environ.get(LOCALID_ENV, "").strip()
    if actual_local.isdigit() and int(actual_local) != local:
        seen.append(f"{LOCALID_ENV}={actual_local}")
        expected.append(f"local task {local}")
    actual_ranks = _ids(os.environ.get(GTIDS_ENV, ""))
    if actual_ranks is not None and sorted(actual_ranks) != computed_ranks:
        seen.append(f"{GTIDS_ENV}={os.environ[GTIDS_ENV]}")
        expected.append(f"ranks {','.join(map(str, computed_ranks))} on that node")
    if seen:
        raise ValueError(
            f"Slurm placed task {rank} differently from the layout computed from {how}: "
            f"Slurm says {', '.join(seen)}; the layout says {', '.join(expected)}. Refusing "
            "to build a cluster spec with wrong addresses; if srun was given an option that "
            "changes placement, describe the cluster explicitly (JAXCLUSTER_WORKERS or "
            "TF_CONFIG)"
        )
