"""jaxcluster: TF-style cluster resolvers and ClusterCoordinator for JAX."""

from __future__ import annotations

from jaxcluster._native import __version__ as __version__

__all__ = ["__version__"]
