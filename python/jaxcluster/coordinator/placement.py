"""What the workers reported about their JAX devices, and whether a function fits them.

The dispatcher keeps each worker's last ``GetStatus``: its platform, device count and device
kind. A ``jax.jit`` function is exported for the workers' platforms; an export whose
shardings span ``n`` devices runs on a worker's first ``n`` local devices, so it is refused
at ``schedule()`` — before anything runs — when a worker has fewer devices or another
platform. A coordinator needs none of the workers' hardware for this: the export is lowered
for the platforms and mesh the function names (an ``AbstractMesh`` works without devices).

Example::

    facts = WorkerFacts(dispatcher)
    facts.platforms()            # ('tpu',) once a TPU worker answered
    facts.check(serialized_fn)   # InvalidArgumentError naming the worker that cannot run it
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from jaxcluster import errors
from jaxcluster._native import core
from jaxcluster.coordinator.functions import KIND_JAX_EXPORT, SerializedFunction

if TYPE_CHECKING:
    from jaxcluster._core import Dispatcher, WorkerReport

__all__ = ["WorkerFacts"]

#: How long what the workers reported is trusted before asking the dispatcher again.
_TTL_SECONDS = 5.0
#: How long an export waits for the first worker to report its platform, at start-up.
_FIRST_REPORT_SECONDS = 10.0


class WorkerFacts:
    """The workers' platforms and device counts, as the dispatcher last heard them."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._lock = threading.Lock()
        self._cached: tuple[float, list[tuple[int, str, WorkerReport]]] | None = None
        self._waited = False  # waits for a first report once, not on every export

    def _reported(self, wait: bool = False) -> list[tuple[int, str, WorkerReport]]:
        """Index, address and last report of the workers that have answered (cached for a
        few seconds); with ``wait``, waits a little for the first answer when none has come
        yet."""
        now = time.monotonic()
        with self._lock:
            cached = self._cached
        if cached is not None and now < cached[0]:
            return cached[1]
        if wait and not self._waited:
            self._waited = True
            # Woken by the first report itself (GIL released, Ctrl-C ends it).
            self._dispatcher.wait_reported(_FIRST_REPORT_SECONDS)
        reported = [
            (s.index, s.address, s.report)
            for s in self._dispatcher.worker_statuses()
            if s.report is not None and s.report.platform and s.state != core.WorkerState.REMOVED
        ]
        if reported:
            with self._lock:
                self._cached = (time.monotonic() + _TTL_SECONDS, reported)
        return reported

    def platforms(self) -> tuple[str, ...]:
        """The workers' JAX platforms, for exports (this process's backend while no worker
        has reported yet, after a short wait for the first one)."""
        known = sorted({report.platform for _, _, report in self._reported(wait=True)})
        if not known:
            from jaxcluster.devices import export_platform

            known = [export_platform()]
        return tuple(known)

    def check(self, function: SerializedFunction) -> None:
        """Raises ``InvalidArgumentError`` when a worker that has reported cannot run
        ``function``: fewer devices than its shardings span, or another platform."""
        if function.kind != KIND_JAX_EXPORT:
            return
        for index, address, report in self._reported():
            platform = report.platform
            count = report.device_count
            kind = report.device_kind or platform
            if function.platforms and platform not in function.platforms:
                raise errors.InvalidArgumentError(
                    f"{function.name or 'the function'} was exported for platform(s) "
                    f"{', '.join(function.platforms)} but worker {index} "
                    f"({address}) runs on {platform!r}; export for the workers' platform"
                )
            if count and count < function.devices:
                raise errors.InvalidArgumentError(
                    f"{function.name or 'the function'} needs {function.devices} devices (its "
                    f"shardings span a mesh of {function.devices}) but worker "
                    f"{index} ({address}) has {count} {kind} device(s); use a "
                    f"mesh of at most {count} devices, or workers with more"
                )
