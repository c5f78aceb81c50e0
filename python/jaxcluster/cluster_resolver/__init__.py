"""Cluster resolvers: find the tasks of a job on TF_CONFIG, Slurm, Kubernetes, GCE, Cloud TPU,
SageMaker, or from explicit settings. Names and semantics follow
``tf.distribute.cluster_resolver`` so TF code ports by changing the import.

Example::

    from jaxcluster.cluster_resolver import TFConfigClusterResolver
    resolver = TFConfigClusterResolver()
    print(resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id)

Submodules load on first use: the Kubernetes and Google clients are only imported by the
resolvers that need them, which keeps ``import jaxcluster`` fast on a laptop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    "ClusterResolver": "base",
    "format_master_url": "base",
    "SimpleClusterResolver": "simple",
    "UnionClusterResolver": "union",
    "UnionResolver": "union",
    "TFConfigClusterResolver": "tfconfig",
    "SlurmClusterResolver": "slurm",
    "expand_hostlist": "slurm",
    "expand_tasks_per_node": "slurm",
    "GCEClusterResolver": "gce",
    "KubernetesClusterResolver": "k8s",
    "KubernetesExecutableLocation": "k8s",
    "TPUClusterResolver": "tpu",
    "SageMakerClusterResolver": "sagemaker",
    "resolve": "detect",
    "explain": "detect",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # pragma: no cover
    from .base import ClusterResolver, format_master_url  # noqa: F401
    from .detect import explain, resolve  # noqa: F401
    from .gce import GCEClusterResolver  # noqa: F401
    from .k8s import KubernetesClusterResolver, KubernetesExecutableLocation  # noqa: F401
    from .sagemaker import SageMakerClusterResolver  # noqa: F401
    from .simple import SimpleClusterResolver  # noqa: F401
    from .slurm import SlurmClusterResolver, expand_hostlist, expand_tasks_per_node  # noqa: F401
    from .tfconfig import TFConfigClusterResolver  # noqa: F401
    from .tpu import TPUClusterResolver  # noqa: F401
    from .union import UnionClusterResolver, UnionResolver  # noqa: F401
