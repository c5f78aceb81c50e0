"""Waiting until every ps task of a strategy answers (``ParameterServerStrategy.wait_for_ps``).

Creating variables needs every ps task up, and in a freshly scheduled job (Kubernetes pods,
Slurm steps) the ps tasks may still be starting when the coordinator's program runs. Each
probe is one bounded ``get_status`` call, and the pause between probes is an ``Event`` wait
of a fraction of a second, so Ctrl-C interrupts the wait promptly.

A ps task of another jaxcluster release is logged as a WARNING (the protocol revision
guards the wire; a ps runs no JAX and unpickles no code, so the coordinator's Python and
JAX rules of rust/dispatch/versions.rs do not apply to it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from jaxcluster import errors
from jaxcluster._native import __version__
from jaxcluster.strategy._clients import client_for

_log = logging.getLogger(__name__)

__all__ = ["wait_for_ps"]

#: Longest single status probe, in seconds (a ps that accepts but never answers).
_PROBE_TIMEOUT = 2.0
#: Pause between probes of a ps task that did not answer, in seconds.
_RETRY_PAUSE = 0.2
#: Errors that mean "not up yet": anything else (a wrong token, a bad CA) is raised at once.
_NOT_YET = (errors.UnavailableError, errors.DeadlineExceededError)


def wait_for_ps(
    ps: Mapping[int, str],
    token: str | None,
    tls_ca: bytes | None,
    timeout: float | None,
) -> None:
    """Returns once every ps task in ``ps`` (index -> address) answered a status call.

    Raises ``DeadlineExceededError`` naming the tasks that did not answer within
    ``timeout`` seconds (``None``: wait forever); errors other than "unreachable" (e.g.
    ``UnauthenticatedError``) are raised at once, since waiting would not cure them.
    """
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = dict(sorted(ps.items()))
    last_error: dict[int, BaseException] = {}
    pause = threading.Event()  # never set: an interruptible sleep
    while True:
        for index, address in list(pending.items()):
            remaining = None if deadline is None else deadline - time.monotonic()
            probe = _PROBE_TIMEOUT if remaining is None else min(_PROBE_TIMEOUT, remaining)
            try:
                status = client_for(address, token, tls_ca).get_status(timeout=max(probe, 0.05))
            except _NOT_YET as exc:
                last_error[index] = exc
                continue
            del pending[index]
            if status.jaxcluster_version != __version__:
                _log.warning(
                    "ps task /job:ps/task:%d at %s runs jaxcluster %s, this process "
                    "jaxcluster %s; install the same release everywhere",
                    index,
                    address,
                    status.jaxcluster_version or "(not reported)",
                    __version__,
                )
        if not pending:
            return
        if deadline is not None and time.monotonic() >= deadline:
            missing = ", ".join(
                f"/job:ps/task:{i} at {a} ({type(last_error[i]).__name__})"
                for i, a in pending.items()
            )
            raise errors.DeadlineExceededError(
                f"{len(pending)} of {len(ps)} ps tasks did not answer within {timeout:g} s: "
                f"{missing}; check that they were started, with this token and CA, and "
                "that their ports are reachable from here"
            )
        wait = _RETRY_PAUSE if deadline is None else min(_RETRY_PAUSE, deadline - time.monotonic())
        pause.wait(max(wait, 0.0))
