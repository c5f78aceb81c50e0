"""Parameter-server failures, as this package named them first: the helpers live in
``jaxcluster._ps_failures`` next to the errors (public as ``jaxcluster.strategy.{
TransientPSFailures, is_ps_failure, failed_ps_task}``), and the error is built by
:class:`jaxcluster.errors.PSUnavailableError` itself.

Example::

    from jaxcluster.strategy.failures import ps_unavailable
    error = ps_unavailable(1, "10.0.0.2:2222", "connection refused", None)
    error.task_id  # 1
"""

from __future__ import annotations

from jaxcluster import errors
from jaxcluster._ps_failures import TRANSIENT_PS_FAILURES_ENV as TRANSIENT_PS_FAILURES_ENV
from jaxcluster._ps_failures import TransientPSFailures as TransientPSFailures
from jaxcluster._ps_failures import failed_ps_task as failed_ps_task
from jaxcluster._ps_failures import is_ps_failure as is_ps_failure

__all__ = [
    "TRANSIENT_PS_FAILURES_ENV",
    "TransientPSFailures",
    "failed_ps_task",
    "is_ps_failure",
    "ps_unavailable",
]


def ps_unavailable(
    task_id: int, address: str, detail: str, original: BaseException | None
) -> errors.PSUnavailableError:
    """``PSUnavailableError(task_id, address, original, detail)`` (this argument order)."""
    return errors.PSUnavailableError(task_id, address, original, detail)
