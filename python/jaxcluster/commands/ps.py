"""``jaxcluster ps``: run a parameter-server process serving variables over gRPC."""

from __future__ import annotations

from jaxcluster.ps.main import add_arguments as add_arguments
from jaxcluster.ps.main import run as run

__all__ = ["add_arguments", "run"]
