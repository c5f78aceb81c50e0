"""``initialize``: start ``jax.distributed`` from a cluster resolver.

Example::

    import jaxcluster
    jaxcluster.initialize()              # detect TF_CONFIG, Slurm, Kubernetes, ...
    jaxcluster.initialize(TFConfigClusterResolver(), coordinator_port=7777)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxcluster.cluster_resolver._bridge import parse_port, with_port

if TYPE_CHECKING:  # pragma: no cover
    from jaxcluster.cluster_resolver.base import ClusterResolver

__all__ = ["initialize"]

# Arguments of jax.distributed.initialize that an override may set directly.
_JAX_ARGS = frozenset(
    {
        "coordinator_address",
        "num_processes",
        "process_id",
        "local_device_ids",
        "initialization_timeout",
        "heartbeat_timeout_seconds",
        "shutdown_timeout_seconds",
        "coordinator_bind_address",
    }
)
_REQUIRED = ("coordinator_address", "num_processes", "process_id")


def initialize(resolver: ClusterResolver | None = None, **overrides: Any) -> dict[str, Any]:
    """Calls ``jax.distributed.initialize`` with arguments from ``resolver``.

    With ``resolver=None`` the environment is detected with
    :func:`jaxcluster.cluster_resolver.resolve`, which receives every override that is not a
    ``jax.distributed.initialize`` argument (``task_type``, ``task_id``, constructor
    arguments). ``coordinator_address``, ``num_processes``, ``process_id``,
    ``local_device_ids`` (and JAX's timeout arguments) override what the resolver derived;
    ``coordinator_port`` replaces the port of the coordinator address. When all three of
    ``coordinator_address``, ``num_processes`` and ``process_id`` are given, nothing is
    resolved. Returns the arguments passed to ``jax.distributed.initialize``.
    """
    coordinator_port = overrides.pop("coordinator_port", None)
    jax_args = {name: overrides.pop(name) for name in list(overrides) if name in _JAX_ARGS}
    if resolver is None and all(jax_args.get(name) is not None for name in _REQUIRED):
        if overrides:
            raise TypeError(
                f"unexpected arguments {sorted(overrides)}: nothing is resolved when "
                "coordinator_address, num_processes and process_id are all given"
            )
        args: dict[str, Any] = {}
    else:
        if resolver is None:
            from jaxcluster.cluster_resolver import resolve  # deferred: detect imports clients

            resolver = resolve(**overrides)
        elif overrides:
            raise TypeError(
                f"unexpected arguments {sorted(overrides)} with an explicit resolver; "
                f"expected only {sorted(_JAX_ARGS | {'coordinator_port'})}"
            )
        args = dict(resolver.jax_distributed_args(coordinator_port=coordinator_port))
    args.update({name: value for name, value in jax_args.items() if value is not None})
    if coordinator_port is not None and "coordinator_address" in jax_args:
        # An explicit address still takes the explicit port, as the docstring promises.
        port = parse_port(coordinator_port, "coordinator_port")
        args["coordinator_address"] = with_port(str(args["coordinator_address"]), port)

    import jax  # deferred: importing jax is slow and not every caller of this module needs it

    jax.distributed.initialize(**args)
    return args
