"""``jaxcluster worker``'s multi-host slice flags, and this host's :class:`SliceConfig`
from them: given outright, defaulted from the task index, or derived from a resolver that
knows its slices (a multi-host TPU VM's ``TPUClusterResolver``).

Example::

    jaxcluster worker --index 3 --slice-size 2 --slice-coordinator 10.0.0.2:8476
    # slice 1, rank 1: tasks 2 and 3 form slice 1, whose rank 0 (task 2) serves the
    # jax.distributed coordinator

    jaxcluster worker --from-resolver gce_tpu_vm   # on each host of a multi-host TPU VM:
    # the TPU's hosts are one slice; rank = this host's worker number
"""

from __future__ import annotations

import argparse
from typing import Any, TypedDict

from jaxcluster._task_process import TaskSetupError
from jaxcluster.worker.slice import SliceConfig

__all__ = [
    "DEFAULT_SLICE_PORT",
    "add_slice_arguments",
    "explicit_flags",
    "peer_tls_ca",
    "slice_config",
    "slice_status",
]

#: The port of a slice's jax.distributed coordinator on its rank-0 host, when derived.
DEFAULT_SLICE_PORT = 8476


def add_slice_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the slice flags to ``parser``."""
    group = parser.add_argument_group(
        "multi-host slices",
        "K hosts that form one jax.distributed group and run every closure SPMD; the "
        "coordinator (ClusterCoordinator(hosts_per_slice=K)) talks to rank 0",
    )
    group.add_argument("--slice-size", type=int, default=None, help="hosts per slice (K)")
    group.add_argument(
        "--slice-index", type=int, default=None, help="this host's slice (default --index // K)"
    )
    group.add_argument(
        "--slice-rank", type=int, default=None, help="rank in the slice (default --index %% K)"
    )
    group.add_argument(
        "--slice-coordinator",
        default=None,
        metavar="HOST:PORT",
        help="the slice's jax.distributed coordinator, served by its rank 0 (default: the "
        f"host of the slice's first worker task, port {DEFAULT_SLICE_PORT}, from "
        "--from-resolver)",
    )
    group.add_argument(
        "--slice-heartbeat-timeout",
        type=float,
        default=10.0,
        help="seconds a host of the slice may go unanswered before the slice is failed "
        "and its hosts restart (default 10)",
    )
    group.add_argument(
        "--slice-init-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for every host of the slice to join (default 300)",
    )
    group.add_argument(
        "--no-restart",
        action="store_true",
        help="exit when the slice breaks instead of starting again (for an orchestrator "
        "that restarts the process itself)",
    )
    group.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)


def _explicit(args: argparse.Namespace) -> bool:
    return any(
        v is not None
        for v in (args.slice_size, args.slice_index, args.slice_rank, args.slice_coordinator)
    )


def slice_config(args: argparse.Namespace, index: int) -> SliceConfig | None:
    """This host's slice, or ``None`` outside one (``--slice-size`` 1, or absent and not
    derivable from ``--from-resolver``). Raises :class:`TaskSetupError` saying what is
    wrong with the flags."""
    if not _explicit(args):
        if args.from_resolver is None:
            return None
        return _from_resolver_slices(args, index)
    size = args.slice_size
    if size is None or size == 1:
        if size is None:
            raise TaskSetupError(
                "--slice-index/--slice-rank/--slice-coordinator need --slice-size K"
            )
        return None
    if size < 1:
        raise TaskSetupError(f"--slice-size {size}; expected at least 1")
    slice_index = index // size if args.slice_index is None else args.slice_index
    rank = index % size if args.slice_rank is None else args.slice_rank
    coordinator = args.slice_coordinator
    if coordinator is None:
        if args.from_resolver is None:
            raise TaskSetupError(
                "--slice-size needs --slice-coordinator HOST:PORT (the slice's rank-0 host) "
                "or --from-resolver to derive it"
            )
        spec = _resolver(args).cluster_spec()
        try:
            leader = spec.task_address("worker", slice_index * size)
        except (KeyError, ValueError, IndexError) as exc:
            raise TaskSetupError(
                f"--from-resolver {args.from_resolver!r} has no worker task "
                f"{slice_index * size} to lead slice {slice_index}: {exc}"
            ) from None
        coordinator = _leader_address(leader)
    return _config(args, slice_index, rank, size, coordinator)


def _from_resolver_slices(args: argparse.Namespace, index: int) -> SliceConfig | None:
    """The slice of worker task ``index`` when the resolver groups its workers into
    slices (``resolver.slices()``); ``None`` when it does not or the slice is one host."""
    known = getattr(_resolver(args), "slices", None)
    if not callable(known):
        return None
    position = 0
    for slice_index, hosts in enumerate(known() or []):
        if position <= index < position + len(hosts):
            if len(hosts) == 1:
                return None
            rank = index - position
            return _config(args, slice_index, rank, len(hosts), _leader_address(hosts[0]))
        position += len(hosts)
    return None


def _resolver(args: argparse.Namespace) -> Any:
    from jaxcluster.cluster_resolver import resolve

    try:
        return resolve(environment=args.from_resolver)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise TaskSetupError(f"--from-resolver {args.from_resolver!r} failed: {exc}") from exc


def _leader_address(worker_address: str) -> str:
    return f"{worker_address.rpartition(':')[0]}:{DEFAULT_SLICE_PORT}"


def _config(
    args: argparse.Namespace, index: int, rank: int, size: int, coordinator: str
) -> SliceConfig:
    try:
        return SliceConfig(
            index=index,
            rank=rank,
            size=size,
            coordinator=coordinator,
            init_timeout=args.slice_init_timeout,
            heartbeat_timeout=args.slice_heartbeat_timeout,
        )
    except ValueError as exc:
        raise TaskSetupError(str(exc)) from None


def explicit_flags(config: SliceConfig) -> list[str]:
    """Flags that give a process ``config`` outright (a supervisor's child need not
    resolve again)."""
    return [
        "--slice-size",
        str(config.size),
        "--slice-index",
        str(config.index),
        "--slice-rank",
        str(config.rank),
        "--slice-coordinator",
        config.coordinator,
    ]


class SliceStatus(TypedDict, total=False):
    """What a worker server is told of its slice, as its keyword arguments."""

    slice_index: int
    slice_rank: int
    slice_size: int


def slice_status(config: SliceConfig | None) -> SliceStatus:
    """What ``GetStatus`` reports about this host's slice (nothing outside one)."""
    if config is None:
        return {}
    return {"slice_index": config.index, "slice_rank": config.rank, "slice_size": config.size}


def peer_tls_ca(tls_cert: bytes | None) -> bytes | None:
    """The CA a slice host verifies its peers with: none when it serves plaintext (its
    peers do too), else ``JAXCLUSTER_TLS_CA``, which must then be set (a host serving TLS
    never sends the token to its peers in clear text)."""
    if tls_cert is None:
        return None
    from jaxcluster._tls import TLS_CA_ENV, ca_from_env

    ca = ca_from_env()
    if ca is None:
        raise TaskSetupError(
            f"this slice host serves TLS (--tls-cert), so it reaches the other hosts of its "
            f"slice over TLS too: set {TLS_CA_ENV} to the CA (path or PEM) that signed the "
            "slice's certificates"
        )
    return ca
