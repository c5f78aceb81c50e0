"""``jaxcluster resolve``: detect the cluster this process runs in and print it.

``--format json`` (default) prints the cluster spec, this task, the RPC layer, the master, the
environment and the ``jax.distributed`` arguments, with where each came from; ``--format env``
prints ``export`` lines a shell can ``eval``, of the variables something reads: ``TF_CONFIG``
(read by TF, by ``TFConfigClusterResolver`` and so by ``jaxcluster.initialize()``, which then
finds every ``jax.distributed`` argument), ``JAX_COORDINATOR_PORT`` (read by
``jaxcluster.initialize()`` and by JAX's own cluster detection, so the coordinator keeps the
port resolved here, e.g. one derived from a Slurm job id) and ``JAX_COORDINATOR_ADDRESS`` (the
one argument ``jax.distributed.initialize()`` itself reads from the environment; it reads no
variable for the process count or id, which a comment line shows); ``--format explain``
prints the human-readable report of :func:`jaxcluster.cluster_resolver.explain`. Exit status 0
on success, 1 when the cluster cannot be resolved (with a one-paragraph error on stderr).

Example::

    $ eval "$(jaxcluster resolve --format env)"
    $ python -c "import jaxcluster; jaxcluster.initialize()"
    $ jaxcluster resolve --format explain --task-id 0
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jaxcluster.cluster_resolver.detect import ENVIRONMENTS

    parser.add_argument(
        "--format",
        choices=("json", "env", "explain"),
        default="json",
        help="output format (default: json)",
    )
    parser.add_argument(
        "--environment",
        choices=[env.name for env in ENVIRONMENTS],
        help="use this environment instead of detecting one",
    )
    parser.add_argument("--task-type", help="override the task type (job name)")
    parser.add_argument("--task-id", type=int, help="override the task index within its job")
    parser.add_argument("--rpc-layer", help="override the RPC layer, e.g. grpc")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for name in ("task_type", "task_id", "rpc_layer"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    return overrides


def _fail(message: str) -> int:
    # One paragraph: newlines from multi-line reports become "; " separators.
    text = "; ".join(line.strip(" -") for line in message.splitlines() if line.strip())
    print(f"jaxcluster resolve: error: {text}", file=sys.stderr)
    return 1


def _no_environment_message(report: Any) -> str:
    tried = "; ".join(f"{c.name}: {c.reason}" for c in report.checks)
    return (
        f"no cluster environment detected (tried {tried}). Set one up, e.g. "
        "JAXCLUSTER_WORKERS=host:port,... with JAXCLUSTER_TASK_ID, or pick one with "
        "--environment NAME."
    )


def _json(report: Any) -> str:
    from jaxcluster.cluster_resolver._explanation import public_class_name

    out: dict[str, Any] = {"environment": report.environment}
    # The class a user can import (an environment's private helper subclass is not one).
    out["resolver"] = public_class_name(report.resolver)
    sources: dict[str, str] = {}
    errors: dict[str, str] = {}
    for value in report.values:
        out[value.name] = value.value
        sources[value.name] = value.source
        if value.error is not None:
            errors[value.name] = value.error
    out["sources"] = sources
    if errors:
        out["errors"] = errors
    out["detection"] = [c.as_dict() for c in report.checks]
    return json.dumps(out, indent=2, default=str)


def _env(report: Any) -> str:
    values = {v.name: v for v in report.values}
    tf_config: dict[str, Any] = {"cluster": values["cluster_spec"].value}
    task_type, task_id = values["task_type"].value, values["task_id"].value
    if task_type is not None and task_id is not None:
        tf_config["task"] = {"type": task_type, "index": int(task_id)}
    if values["rpc_layer"].value:
        tf_config["rpc_layer"] = values["rpc_layer"].value
    lines = [f"export TF_CONFIG={shlex.quote(json.dumps(tf_config, sort_keys=False))}"]
    jax_args = values["jax_distributed_args"]
    if jax_args.error is not None:
        lines.append(f"# JAX_COORDINATOR_ADDRESS not set: {' '.join(jax_args.error.split())}")
    else:
        address = jax_args.value["coordinator_address"]
        lines.append(f"export JAX_COORDINATOR_ADDRESS={shlex.quote(address)}")
        lines.append(f"export JAX_COORDINATOR_PORT={shlex.quote(address.rsplit(':', 1)[-1])}")
        # JAX reads no variable for these (JAX_NUM_PROCESSES/JAX_PROCESS_ID would be ignored):
        # jaxcluster.initialize() derives them from TF_CONFIG; say them for a direct call.
        lines.append(
            f"# jax.distributed.initialize(num_processes={int(jax_args.value['num_processes'])}, "
            f"process_id={int(jax_args.value['process_id'])}), or jaxcluster.initialize()"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from jaxcluster.cluster_resolver.detect import explain

    try:
        report = explain(environment=args.environment, **_overrides(args))
    except (ValueError, TypeError) as exc:  # a bad argument, e.g. an unknown environment
        return _fail(str(exc))
    if args.format == "explain":
        print(report)
        return 0 if report.error is None else 1
    if report.environment is None:
        return _fail(_no_environment_message(report))
    if report.error is not None:
        return _fail(f"the {report.environment} environment could not be resolved: {report.error}")
    print(_json(report) if args.format == "json" else _env(report))
    return 0
