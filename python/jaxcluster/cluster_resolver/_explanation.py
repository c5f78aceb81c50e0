"""The report ``explain()`` returns: what each environment said, which one was chosen, and
every resolved value with where it came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jaxcluster.cluster_resolver._env_base import Built
from jaxcluster.cluster_resolver.base import ClusterResolver

__all__ = [
    "EnvironmentCheck",
    "Explanation",
    "ResolvedValue",
    "explain_built",
    "public_class_name",
]


def public_class_name(obj: object) -> str:
    """The name of the first class of ``obj`` a user can import: an environment's private
    helper subclass is reported as the public resolver it extends."""
    for cls in type(obj).__mro__:
        if not cls.__name__.startswith("_"):
            return cls.__name__
    return type(obj).__name__  # pragma: no cover - object itself is public


@dataclass(frozen=True)
class EnvironmentCheck:
    """One environment's local detection result."""

    name: str
    title: str
    detected: bool
    reason: str
    chosen: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "detected": self.detected,
            "chosen": self.chosen,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class ResolvedValue:
    """A value the resolver produced (or failed to) and its origin."""

    name: str
    value: Any
    source: str
    error: str | None = None

    def __str__(self) -> str:
        if self.error is not None:
            return f"{self.name}: unavailable ({self.error})"
        return f"{self.name}={self.value!r} from {self.source}"

    def as_dict(self) -> dict[str, Any]:
        out = {"value": self.value, "source": self.source}
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class Explanation:
    """The result of :func:`~jaxcluster.cluster_resolver.explain`.

    ``checks``: every environment, in the order tried; ``environment``: the chosen one's name
    (``None`` when none); ``values``: ``cluster_spec``, ``task_type``, ``task_id``,
    ``rpc_layer``, ``master`` and ``jax_distributed_args``; ``error``: why resolving failed.
    """

    checks: list[EnvironmentCheck]
    environment: str | None
    why: str
    resolver: ClusterResolver | None = None
    values: list[ResolvedValue] = field(default_factory=list)
    error: str | None = None

    def value(self, name: str) -> ResolvedValue:
        for value in self.values:
            if value.name == name:
                return value
        raise KeyError(f"no resolved value {name!r}; have: {[v.name for v in self.values]}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "why": self.why,
            "resolver": public_class_name(self.resolver) if self.resolver is not None else None,
            "checks": [c.as_dict() for c in self.checks],
            "values": {v.name: v.as_dict() for v in self.values},
            "error": self.error,
        }

    def __str__(self) -> str:
        lines = ["Cluster environments, in the order tried:"]
        for check in self.checks:
            mark = "*" if check.chosen else ("+" if check.detected else "-")
            lines.append(f"  {mark} {check.name:<11} {check.reason}")
        if self.environment is not None:
            resolver = public_class_name(self.resolver) if self.resolver is not None else "?"
            lines.append(f"Chosen: {self.environment} ({self.why}), resolver {resolver}")
        if self.values:
            lines.append("Resolved values:")
            lines.extend(f"  {value}" for value in self.values)
        if self.error is not None:
            lines.append(f"Error: {self.error}")
        return "\n".join(lines)


def _attempt(name: str, source: str, compute: Any) -> ResolvedValue:
    try:
        return ResolvedValue(name, compute(), source)
    except Exception as exc:  # each value is reported on its own; one failure hides nothing
        return ResolvedValue(name, None, source, error=f"{type(exc).__name__}: {exc}")


def explain_built(
    checks: list[EnvironmentCheck], environment: str, why: str, built: Built
) -> Explanation:
    resolver, sources = built.resolver, built.sources
    values = [_attempt("cluster_spec", sources.get("cluster", "?"), lambda: _spec(resolver))]
    for name in ("task_type", "task_id", "rpc_layer"):
        values.append(_attempt(name, sources.get(name, "?"), lambda n=name: getattr(resolver, n)))
    values.append(
        _attempt(
            "master",
            "cluster_spec[task_type][task_id] with rpc_layer",
            lambda: _master(resolver),
        )
    )
    values.append(
        _attempt(
            "jax_distributed_args",
            sources.get(
                "jax_distributed_args", "cluster_spec and task (chief first, then jobs in order)"
            ),
            resolver.jax_distributed_args,
        )
    )
    failed = [v for v in values if v.error is not None and v.name == "cluster_spec"]
    error = failed[0].error if failed else None
    return Explanation(checks, environment, why, resolver, values, error)


def _spec(resolver: ClusterResolver) -> dict[str, Any]:
    return {job: tasks for job, tasks in resolver.cluster_spec().as_dict().items()}


def _master(resolver: ClusterResolver) -> str:
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None or task_id is None:
        return resolver.master()
    return resolver.master(task_type, task_id)
