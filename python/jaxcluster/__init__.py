"""jaxcluster: TF-style cluster resolvers and ClusterCoordinator for JAX, with a Rust core.

Example::

    import jaxcluster
    from jaxcluster.cluster_resolver import TFConfigClusterResolver

    resolver = TFConfigClusterResolver()
    jaxcluster.initialize(resolver)          # jax.distributed.initialize from TF_CONFIG

Or schedule closures on the workers of a cluster (here a local one)::

    with jaxcluster.LocalCluster(2) as cluster, cluster.coordinator() as coordinator:
        value = coordinator.schedule(pow, args=(2, 10))   # a jaxcluster.RemoteValue
        value.fetch()                                     # 1024
    isinstance(coordinator, jaxcluster.ClusterCoordinator)  # True

Heavy parts (JAX, the Kubernetes and Google clients, worker processes) load on first use, so
``import jaxcluster`` stays cheap.

Log records go to the ``jaxcluster`` logger hierarchy (``jaxcluster.dispatch``,
``jaxcluster.coordinator``, ``jaxcluster.worker``, ...), Rust events included; the package
adds only a ``NullHandler``, so nothing is printed until the application configures
``logging``.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from jaxcluster._native import __version__ as __version__
from jaxcluster.cluster_spec import ClusterSpec as ClusterSpec
from jaxcluster.device_spec import DeviceSpec as DeviceSpec

# A library logs, the application decides where to: without this handler, Python's
# last-resort handler would print WARNING records of an unconfigured application.
logging.getLogger("jaxcluster").addHandler(logging.NullHandler())

# public name -> submodule that defines it, imported on first access
_LAZY: dict[str, str] = {
    "ClearTextTokenWarning": "jaxcluster._auth",
    "ClusterCoordinator": "jaxcluster.coordinator",
    "LocalCluster": "jaxcluster.local_cluster",
    "ParameterServerStrategy": "jaxcluster.strategy",
    "RemoteValue": "jaxcluster.coordinator",
    "initialize": "jaxcluster.distributed",
    "progress": "jaxcluster.progress",
}

__all__ = [
    "ClearTextTokenWarning",
    "ClusterCoordinator",
    "ClusterSpec",
    "DeviceSpec",
    "LocalCluster",
    "ParameterServerStrategy",
    "RemoteValue",
    "__version__",
    "initialize",
    "progress",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxcluster' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # pragma: no cover
    from jaxcluster._auth import ClearTextTokenWarning
    from jaxcluster.coordinator import ClusterCoordinator, RemoteValue
    from jaxcluster.distributed import initialize
    from jaxcluster.local_cluster import LocalCluster
    from jaxcluster.progress import progress
    from jaxcluster.strategy import ParameterServerStrategy
