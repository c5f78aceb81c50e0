"""What every auto-detected cluster environment is: a name, a cheap local presence check, and
a ``build`` that makes the resolver and says where each value came from.

Building applies the caller's overrides: constructor arguments of the environment's resolver
go to its constructor, and ``task_type`` / ``task_id`` / ``rpc_layer`` are set on the resolver
afterwards, so an override always wins over anything the environment says.
"""

from __future__ import annotations

import abc
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from jaxcluster.cluster_resolver.base import ClusterResolver

__all__ = [
    "TASK_ATTRIBUTES",
    "Built",
    "Detection",
    "Environment",
    "env_int",
    "parse_addresses",
]

#: Overrides that are set on any resolver after it is made, whatever its constructor takes.
TASK_ATTRIBUTES = ("task_type", "task_id", "rpc_layer")


@dataclass(frozen=True)
class Detection:
    """Whether an environment is present, and the evidence either way."""

    present: bool
    reason: str


@dataclass
class Built:
    """A resolver and, for each value it resolves, where that value came from.

    ``sources`` keys: ``cluster``, ``task_type``, ``task_id``, ``rpc_layer``.
    """

    resolver: ClusterResolver
    sources: dict[str, str] = field(default_factory=dict)


class Environment(abc.ABC):
    """One kind of cluster a process can find itself in.

    Subclasses set ``name`` (what ``environment=`` selects) and ``title`` (for people), and
    implement :meth:`detect` (local checks only: environment variables and small local files,
    never the network) and :meth:`build`.
    """

    name: ClassVar[str]
    title: ClassVar[str]

    @abc.abstractmethod
    def detect(self) -> Detection:
        """Cheap, local: is this environment present, and why (not)."""

    def is_present(self) -> bool:
        return self.detect().present

    @abc.abstractmethod
    def build(self, **overrides: Any) -> Built:
        """Make the resolver for this environment, applying ``overrides``."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def construct(
    env: Environment,
    factory: Callable[..., ClusterResolver],
    defaults: Mapping[str, Any],
    overrides: Mapping[str, Any],
    sources: dict[str, str],
    *,
    name: str | None = None,
) -> Built:
    """``factory(**defaults | constructor overrides)``, then the task attributes set.

    ``TypeError`` naming the environment and the accepted names for an unknown override.
    """
    name = name or getattr(factory, "__name__", type(factory).__name__)
    params = inspect.signature(factory).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    known = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = [k for k in overrides if k not in params and k not in TASK_ATTRIBUTES]
    if unknown and not accepts_any:
        accepted = sorted(set(known) | set(TASK_ATTRIBUTES))
        raise TypeError(
            f"override {', '.join(map(repr, unknown))} is not an argument of "
            f"{name}, the resolver of the {env.title} "
            f"environment ({env.name!r}); it accepts: {', '.join(accepted)}. To pick another "
            "environment pass environment=<name>."
        )
    kwargs = dict(defaults)
    kwargs.update({k: v for k, v in overrides.items() if k in params or accepts_any})
    resolver = factory(**kwargs)
    for attribute in TASK_ATTRIBUTES:
        if attribute in overrides:
            setattr(resolver, attribute, overrides[attribute])
    sources.setdefault("rpc_layer", f"the {name} default")
    shaping = []
    for key, value in overrides.items():
        if key in TASK_ATTRIBUTES:
            sources[key] = f"override {key}={value!r}"
        else:
            shaping.append(f"{key}={value!r}")
    if shaping:
        sources["cluster"] = f"{sources.get('cluster', '?')}, with override {', '.join(shaping)}"
    return Built(resolver, sources)


def env_int(name: str, *, minimum: int = 0) -> int:
    """The integer in environment variable ``name``; ``ValueError`` naming it when bad."""
    raw = os.environ.get(name)
    if raw is None:
        raise ValueError(f"{name} is not set; expected an integer")
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name} is {raw!r}; expected an integer >= {minimum}") from None
    if value < minimum:
        raise ValueError(f"{name} is {raw!r}; expected an integer >= {minimum}")
    return value


def parse_addresses(name: str, raw: str) -> list[str]:
    """``host:port,host:port`` from variable ``name``; ``ValueError`` naming the bad entry."""
    addresses = [a.strip() for a in raw.split(",")]
    if not raw.strip() or not all(addresses):
        raise ValueError(
            f"{name} is {raw!r}; expected a comma-separated list of host:port such as "
            "'10.0.0.1:2222,10.0.0.2:2222'"
        )
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"{name} entry {address!r} (in {raw!r}) is not host:port with a port from 1 "
                "to 65535; expected e.g. '10.0.0.1:2222' or '[fd00::1]:2222'"
            )
    return addresses
