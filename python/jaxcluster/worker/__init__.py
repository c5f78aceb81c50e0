"""The Python side of a jaxcluster worker process.

The Rust core serves the gRPC protocol; this package runs what it receives: the executor
loop, function loading, per-worker resources, and ``get_current_worker_index``. Start a
worker with ``jaxcluster worker`` or ``python -m jaxcluster.worker``.

Example::

    python -m jaxcluster.worker --address 127.0.0.1:0 --index 0
    # jaxcluster worker listening on 127.0.0.1:40123
"""

from __future__ import annotations

from jaxcluster.worker.context import get_current_worker_index as get_current_worker_index

__all__ = ["get_current_worker_index"]
