"""Copies ``on_preemption="save"`` device state off a worker being preempted.

A worker that announces its preemption (state ``preempting``, with the notice's deadline)
refuses every closure but a *preemption save*: a unary ``RunClosure`` flagged
``preemption_save`` that reads the caller's own session's state. While it holds
``on_preemption="save"`` state no save has read yet, it stays up for them until the
deadline, or until no session it still tracks (ended or vanished past ``--state-ttl``
ones are not) holds such state (``worker/executor.py``).

The coordinator's :class:`PreemptionSaver` sleeps on a ``_core.CellWatch`` the dispatcher
wakes when a link acts on a notice (``Dispatcher.watch_preemptions``; a link learns of the
notice on its stream within a round trip), then reads the dispatcher's view of the workers
(no RPC) and, for each worker newly ``preempting``, reads there every live state created with
``on_preemption="save"``, one save each, bounded by the deadline. The copy (a numpy pytree)
becomes the resource's build arguments for that worker index, held in the coordinator's
memory until the index is next built: the replacement starts from it instead of running
``init_fn``, and the copy is dropped (``PerWorkerResource.set_build_args``). A save that
fails (the worker vanished first, the deadline passed) leaves that worker to ``init_fn``,
logged as a WARNING naming the state and the worker. Saves start and finish with an INFO
line (bytes, seconds) and are counted in ``PerWorkerState.preemption_saves``.

Example::

    saver = PreemptionSaver(dispatcher, functions, connect=lambda address: client)
    saver.watch(state)   # from create_per_worker_state(..., on_preemption="save")
    state.preemption_saves   # PreemptionSaves(saved=0, failed=0, bytes=0)
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from jaxcluster import wire
from jaxcluster._native import core
from jaxcluster.coordinator import _encoding

if TYPE_CHECKING:
    from jaxcluster.coordinator.device_state import PerWorkerState
    from jaxcluster.coordinator.functions import FunctionSerializer

__all__ = ["PreemptionSaver"]

_log = logging.getLogger("jaxcluster.coordinator")


class PreemptionSaver:
    """Saves the ``on_preemption="save"`` states of this coordinator from every worker
    that announces its preemption (see the module docstring). ``connect(address)`` gives a
    ``WorkerClient`` of this coordinator's session and credentials."""

    def __init__(
        self,
        dispatcher: Any,
        functions: FunctionSerializer,
        connect: Callable[[str], Any],
    ) -> None:
        self._dispatcher = dispatcher
        self._functions = functions
        self._connect = connect
        self._states: weakref.WeakSet[PerWorkerState] = weakref.WeakSet()
        self._seen: set[tuple[int, int, float | None]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Woken by each preemption notice a link acts on, and by stop().
        self._notices = core.CellWatch()
        dispatcher.watch_preemptions(self._notices)

    def watch(self, state: PerWorkerState) -> None:
        """Saves ``state`` from every worker preempted from now on, while it is alive."""
        with self._lock:
            self._states.add(state)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="jaxcluster-preemption-save", daemon=True
                )
                self._thread.start()

    def _count(self, state: PerWorkerState, saved: int = 0, failed: int = 0, size: int = 0) -> None:
        with self._lock:
            was = state._saves
            state._saves = replace(
                was, saved=was.saved + saved, failed=was.failed + failed, bytes=was.bytes + size
            )

    def stop(self) -> None:
        """Stops watching (saves under way finish on their own threads). Idempotent."""
        self._stop.set()
        self._notices.wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self) -> None:
        # A first look for notices that came before this thread started, then one per wake.
        while not self._stop.is_set():
            try:
                self._check()
            except Exception:  # a dispatcher shut down under it; logged, never raised
                _log.debug("the preemption save watch failed", exc_info=True)
            self._notices.wait(None)

    def _check(self) -> None:
        for status in self._dispatcher.worker_statuses():
            if status.state != "preempting":
                continue
            report = status.report
            key = (
                int(status.index),
                0 if report is None else int(report.incarnation),
                status.preemption_deadline,
            )
            with self._lock:
                if key in self._seen:
                    continue
                self._seen.add(key)
                states = list(self._states)
            if states:
                threading.Thread(
                    target=self._save_worker,
                    args=(status.index, status.address, status.preemption_deadline, states),
                    name=f"jaxcluster-preemption-save-{status.index}",
                    daemon=True,
                ).start()

    def _save_worker(
        self, worker: int, address: str, deadline: float | None, states: list[PerWorkerState]
    ) -> None:
        client = self._connect(address)
        for state in states:
            self._save(client, worker, address, deadline, state)

    def _save(
        self,
        client: Any,
        worker: int,
        address: str,
        deadline: float | None,
        state: PerWorkerState,
    ) -> None:
        from jaxcluster.coordinator.device_state import _save_state

        def remaining() -> float | None:
            return None if not deadline else max(deadline - time.time(), 0.001)

        what = f"{state.description} of worker {worker} ({address})"
        left = remaining()
        _log.info(
            "saving %s before its preemption deadline (%s s left)",
            what,
            "unknown" if left is None else f"{left:.1f}",
        )
        started = time.monotonic()
        try:
            host = state._host
            resource = state._resource_for(host)

            def resource_for(values: Any) -> Any:
                return values._resource_for(host)

            function = self._functions.serialize(_save_state, (state,), {})
            client.register_function(
                function.function_hash, function.kind, function.payload, timeout=left
            )
            encoded, _ = _encoding.encode_args((state,), {}, resource_for)
            answer = client.run_closure(
                function.function_hash,
                encoded.pickle,
                encoded.buffers,
                timeout=remaining(),
                worker_index=worker,
                preemption_save=True,
            )
            error = answer["error"]
            if error is not None and error.kind == "input":
                # No value there: the state was never built on that worker.
                _log.info("%s was never built there: nothing to save", what)
                return
            if error is not None:
                raise RuntimeError(str(error))
            size = len(answer["value"]) + sum(memoryview(b).nbytes for b in answer["buffers"])
            value = wire.decode(answer["value"], answer["buffers"])
            args, _ = _encoding.encode_args((value,), {}, resource_for)
            resource.set_build_args(worker, args.pickle, args.buffers)
        except Exception as exc:
            self._count(state, failed=1)
            _log.warning(
                "%s was NOT saved before its preemption deadline (%s: %s); its replacement "
                "builds it with init_fn, losing that worker's progress",
                what,
                type(exc).__name__,
                exc,
            )
            return
        seconds = time.monotonic() - started
        self._count(state, saved=1, size=size)
        _log.info(
            "saved %s: %d bytes in %.2f s (%.0f MB/s); its replacement starts from the copy",
            what,
            size,
            seconds,
            size / 1e6 / max(seconds, 1e-9),
        )
