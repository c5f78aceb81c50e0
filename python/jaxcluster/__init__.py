"""jaxcluster: TF-style cluster resolvers and ClusterCoordinator for JAX, with a Rust core.

Example::

    import jaxcluster
    from jaxcluster.cluster_resolver import TFConfigClusterResolver

    resolver = TFConfigClusterResolver()
    jaxcluster.initialize(resolver)          # jax.distributed.initialize from TF_CONFIG

Heavy parts (JAX, the Kubernetes and Google clients, worker processes) load on first use, so
``import jaxcluster`` stays cheap.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from jaxcluster._native import __version__ as __version__
from jaxcluster.cluster_spec import ClusterSpec as ClusterSpec
from jaxcluster.device_spec import DeviceSpec as DeviceSpec

# public name -> submodule that defines it, imported on first access
_LAZY: dict[str, str] = {
    "LocalCluster": "jaxcluster.local_cluster",
    "ParameterServerStrategy": "jaxcluster.strategy",
    "initialize": "jaxcluster.distributed",
}

# A library's loggers stay quiet until the application configures logging (the core's events,
# e.g. closure retries, arrive under jaxcluster.dispatch and jaxcluster.server).
logging.getLogger("jaxcluster").addHandler(logging.NullHandler())

__all__ = [
    "ClusterSpec",
    "DeviceSpec",
    "LocalCluster",
    "ParameterServerStrategy",
    "__version__",
    "initialize",
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
    from jaxcluster.distributed import initialize
    from jaxcluster.local_cluster import LocalCluster
    from jaxcluster.strategy import ParameterServerStrategy
