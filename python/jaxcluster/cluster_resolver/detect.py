"""``resolve()`` and ``explain()``: find which cluster this process runs in.

Environments are tried in the order of :data:`ENVIRONMENTS`; each first answers a cheap local
question (environment variables, small local files, never the network) and the first one
present builds the resolver. ``environment='slurm'`` (or ``JAXCLUSTER_ENVIRONMENT=slurm``)
skips detection and builds that one. Overrides always win: ``task_type``, ``task_id`` and
``rpc_layer`` are set on the resolver, anything else goes to its constructor.

``environment=`` selects an environment, so the ``environment`` constructor argument of
Simple/TFConfig/SageMaker resolvers (TF's label, e.g. ``'google'``) cannot be overridden
through ``resolve()``; construct the resolver directly for that.

When no environment is present :func:`resolve` raises :class:`NoClusterEnvironmentError` (a
``RuntimeError``: nothing the caller passed was wrong, the process just is not in a cluster
we know), listing every environment and why it was rejected.

Example::

    from jaxcluster.cluster_resolver import resolve, explain
    resolver = resolve()                    # e.g. a SlurmClusterResolver inside srun
    print(explain())                        # what was detected, and where each value came from
    resolver = resolve(environment="explicit", task_id=0)
"""

from __future__ import annotations

import os
from typing import Any

from jaxcluster.cluster_resolver._cloud_environments import (
    GceTpuVmEnvironment,
    GkeTpuEnvironment,
    KubernetesEnvironment,
)
from jaxcluster.cluster_resolver._env_base import Built, Detection, Environment
from jaxcluster.cluster_resolver._environments import (
    ExplicitEnvironment,
    OpenMPIEnvironment,
    SageMakerEnvironment,
    SlurmEnvironment,
    TFConfigEnvironment,
)
from jaxcluster.cluster_resolver._explanation import EnvironmentCheck, Explanation, explain_built
from jaxcluster.cluster_resolver._hints import did_you_mean
from jaxcluster.cluster_resolver.base import ClusterResolver
from jaxcluster.errors import JaxClusterError

__all__ = [
    "ENVIRONMENTS",
    "ENVIRONMENT_ENV",
    "Environment",
    "EnvironmentCheck",
    "Explanation",
    "NoClusterEnvironmentError",
    "explain",
    "resolve",
]

#: Names an environment to use without detection (like ``environment=``).
ENVIRONMENT_ENV = "JAXCLUSTER_ENVIRONMENT"

#: The environments, in the order they are tried. Launchers that describe the whole cluster
#: (TF_CONFIG, Slurm) come before platforms where presence is only a hint; the explicit
#: ``JAXCLUSTER_*`` variables come last, as the fallback a user sets by hand.
ENVIRONMENTS: tuple[Environment, ...] = (
    TFConfigEnvironment(),
    SlurmEnvironment(),
    KubernetesEnvironment(),
    GkeTpuEnvironment(),
    GceTpuVmEnvironment(),
    SageMakerEnvironment(),
    OpenMPIEnvironment(),
    ExplicitEnvironment(),
)


class NoClusterEnvironmentError(JaxClusterError, RuntimeError):
    """No cluster environment was detected; ``checks`` says why each was rejected."""

    HINT = (
        "Set one up (e.g. JAXCLUSTER_WORKERS=host:port,... with JAXCLUSTER_TASK_ID), or "
        f"pick one with environment=<name> or {ENVIRONMENT_ENV}=<name>."
    )

    def __init__(self, checks: list[EnvironmentCheck]) -> None:
        self.checks = checks
        tried = "\n".join(f"  - {c.name} ({c.title}): {c.reason}" for c in checks)
        super().__init__(f"No cluster environment detected. Tried, in order:\n{tried}\n{self.HINT}")


def _check_all(environments: tuple[Environment, ...]) -> list[tuple[Environment, Detection]]:
    return [(env, env.detect()) for env in environments]


def _forced(
    environment: str | None, environments: tuple[Environment, ...]
) -> tuple[Environment | None, str]:
    """The environment named by the argument or ``JAXCLUSTER_ENVIRONMENT``, if any."""
    origin = "environment="
    if environment is None and os.environ.get(ENVIRONMENT_ENV, "").strip():
        environment, origin = os.environ[ENVIRONMENT_ENV].strip(), ENVIRONMENT_ENV
    if environment is None:
        return None, ""
    names = [env.name for env in environments]
    for env in environments:
        if env.name == environment:
            return env, origin
    raise ValueError(
        f"{origin} {environment!r} is not a known cluster environment (known: "
        f"{', '.join(names)}){did_you_mean(environment, names)}"
    )


def _select(
    environment: str | None, environments: tuple[Environment, ...]
) -> tuple[Environment | None, str, list[EnvironmentCheck]]:
    forced, origin = _forced(environment, environments)
    checks: list[EnvironmentCheck] = []
    chosen: Environment | None = forced
    for env, detection in _check_all(environments):
        if chosen is None and detection.present:
            chosen = env
        checks.append(
            EnvironmentCheck(
                env.name, env.title, detection.present, detection.reason, env is chosen
            )
        )
    why = f"chosen by {origin}" if forced is not None else "first environment detected"
    return chosen, why, checks


def _build(env: Environment, overrides: dict[str, Any]) -> Built:
    return env.build(**overrides)


def resolve(
    *,
    environment: str | None = None,
    environments: tuple[Environment, ...] = ENVIRONMENTS,
    **overrides: Any,
) -> ClusterResolver:
    """The resolver for the cluster this process runs in.

    ``environment`` picks one environment by name instead of detecting; ``environments``
    replaces the list tried. Other keyword arguments are overrides (see the module doc).
    Raises :class:`NoClusterEnvironmentError` when nothing is detected, ``TypeError`` for an
    override the chosen resolver does not take, and whatever the resolver raises for a
    malformed environment (e.g. ``ValueError`` naming ``TF_CONFIG``).
    """
    chosen, _, checks = _select(environment, environments)
    if chosen is None:
        raise NoClusterEnvironmentError(checks)
    return _build(chosen, overrides).resolver


def explain(
    *,
    environment: str | None = None,
    environments: tuple[Environment, ...] = ENVIRONMENTS,
    **overrides: Any,
) -> Explanation:
    """What :func:`resolve` would do with the same arguments, and why.

    Never raises for a problem in the environment: the report's ``error`` holds it. ``str()``
    of the result is a human-readable report; ``as_dict()`` a JSON-ready one.
    """
    chosen, why, checks = _select(environment, environments)
    if chosen is None:
        error = f"no cluster environment detected. {NoClusterEnvironmentError.HINT}"
        return Explanation(checks, None, "", error=error)
    try:
        built = _build(chosen, overrides)
    except Exception as exc:  # reported, not raised: explaining a broken setup is the point
        return Explanation(checks, chosen.name, why, error=f"{type(exc).__name__}: {exc}")
    return explain_built(checks, chosen.name, why, built)
