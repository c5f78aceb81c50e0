"""``jaxcluster worker``: run a worker process that executes closures for a coordinator."""

from __future__ import annotations

from jaxcluster.worker.main import add_arguments as add_arguments
from jaxcluster.worker.main import run as run

__all__ = ["add_arguments", "run"]
