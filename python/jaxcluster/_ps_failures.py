"""Parameter-server failures: how they are recognised and counted.

A variable operation that cannot reach its ps task raises
:class:`jaxcluster.errors.PSUnavailableError`, whose fields (``task_type``, ``task_id``,
``address``, ``original_exception``) survive pickling, so an error raised inside a closure
on a worker arrives at the coordinator intact. The worker also reports ``task_id`` in the
protocol (``ClosureError.ps_task``, read with :func:`failed_ps_task`), and the
coordinator's dispatcher counts reports per ps task the way TF's coordinator does: while a
task has fewer than ``TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`` (default 3) reports
they are transient and the closure runs again; from then on the failure is raised. The
same rule is available in Python as :class:`TransientPSFailures`, for code that runs its
own retries. Public as ``jaxcluster.strategy.{TransientPSFailures, is_ps_failure,
failed_ps_task}``; this module sits next to :mod:`jaxcluster.errors` so a worker needs
nothing from the strategy package to report a ps failure.

Example::

    tracker = TransientPSFailures(num_ps=2)
    if tracker.record_and_ignore(error):
        ...  # transient: run the closure again
    else:
        raise error  # a PSUnavailableError (or not a ps failure at all)
"""

from __future__ import annotations

import os
import threading

from jaxcluster import errors

__all__ = [
    "TRANSIENT_PS_FAILURES_ENV",
    "TransientPSFailures",
    "failed_ps_task",
    "is_ps_failure",
]

TRANSIENT_PS_FAILURES_ENV = "TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES"
_ALIAS_ENV = "JAXCLUSTER_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES"
_DEFAULT_THRESHOLD = 3


def _unwrap(error: BaseException) -> BaseException:
    while isinstance(error, (errors.ClosureInputError, errors.ClosureAbortedError)):
        inner = error.original_exception
        if inner is None:
            break
        error = inner
    return error


def is_ps_failure(error: BaseException) -> bool:
    """Whether ``error`` (or the error a ``ClosureInputError``/``ClosureAbortedError``
    wraps) reports an unreachable or restarted ps task."""
    return isinstance(_unwrap(error), errors.PSUnavailableError)


def failed_ps_task(error: BaseException) -> int | None:
    """The ps task index a ps failure names, or ``None``."""
    inner = _unwrap(error)
    if not isinstance(inner, errors.PSUnavailableError):
        return None
    task = getattr(inner, "task_id", None)
    return task if isinstance(task, int) and not isinstance(task, bool) else None


def _threshold_from_env() -> int:
    # The alias wins, as for every TF_COORDINATOR_* variable the dispatcher reads.
    for name in (_ALIAS_ENV, TRANSIENT_PS_FAILURES_ENV):
        raw = os.environ.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ValueError(
                    f"{name}={raw!r} is not an integer; expected how many failure reports "
                    f"per ps task to treat as transient (default {_DEFAULT_THRESHOLD}; 0 "
                    "reports every failure)"
                ) from None
    return _DEFAULT_THRESHOLD


class TransientPSFailures:
    """Counts ps-failure reports per ps task and decides which are transient (TF's rule).

    Connectivity between a worker and a ps can fail briefly; TF's coordinator therefore
    ignores the first reports about a ps task and only reports a failure once
    ``threshold`` reports about the same task have arrived. ``threshold`` defaults to
    ``TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`` (or its ``JAXCLUSTER_`` alias), else 3;
    0 or less reports every failure at once.

    Example::

        tracker = TransientPSFailures(num_ps=2, threshold=3)
        tracker.record_and_ignore(error_from_ps_1)   # True: 1st report, retry
        tracker.record_and_ignore(error_from_ps_1)   # True: 2nd report, retry
        tracker.record_and_ignore(error_from_ps_1)   # False: 3rd report, raise it
    """

    def __init__(self, num_ps: int, threshold: int | None = None) -> None:
        if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
            raise ValueError(f"num_ps={num_ps!r}; expected a non-negative int")
        self._threshold = _threshold_from_env() if threshold is None else int(threshold)
        self._counts = [0] * num_ps
        self._lock = threading.Lock()

    @property
    def threshold(self) -> int:
        """Reports about one ps task at which its failure stops being transient."""
        return self._threshold

    @property
    def counts(self) -> list[int]:
        """Reports recorded so far, per ps task."""
        with self._lock:
            return list(self._counts)

    def record_and_ignore(self, error: BaseException) -> bool:
        """Records ``error`` if it is a ps failure; ``True`` when it should be treated as
        transient (retry the closure), ``False`` when it must be reported (or is not a ps
        failure)."""
        if self._threshold <= 0 or not is_ps_failure(error):
            return False
        task = failed_ps_task(error)
        with self._lock:
            if task is None or not 0 <= task < len(self._counts):
                return False
            self._counts[task] += 1
            return self._counts[task] < self._threshold
