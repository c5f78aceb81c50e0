"""Dataflow's dependency tracker: closures that keep their result on a worker, or take
other closures' results.

``schedule(fn, args, kwargs, keep_result=True)`` has the worker keep the result (a live
object, JAX arrays on device) under an id from the dispatcher's resource-id counter; only a
``wire.KeptInfo`` (spec and size) comes back. A ``RemoteValue`` anywhere in the argument
pytree (tuples, lists, dicts, registered JAX nodes) makes the closure a *consumer*: it is
queued only once every producer has ended, without blocking ``schedule``.

One :class:`Tracker` per coordinator owns every such closure (a :class:`Node`) and one
daemon thread, which sleeps on a ``_core.CellWatch`` (a Rust hook told by each producer's
result cell as it settles, so no thread per producer and no polling) and then:

- submits a consumer whose producers all ended: a kept producer becomes
  ``wire.KeptRef(value_id, holder)`` (the worker resolves it from its own registry, or
  pulls it from the holder peer to peer), a producer that returned its value is inlined;
  it runs on the holder of the most kept bytes when that worker is free (``schedule_on``:
  no bytes move), else on any worker;
- fails a consumer whose producer failed with ``ClosureInputError`` naming the producer
  (the producer's error chained), cancels it when its producer was cancelled, when a
  ``cancel_all`` error is pending, or at ``shutdown``;
- re-makes a lost kept value (lineage): a holder out of service before the consumer is
  queued, or a consumer failing with an input error for a kept id, re-runs the producer
  (recursively for its own kept inputs) and then the consumer, at most
  ``max_closure_retries`` times per value;
- sends the ``ReleaseResource`` of a kept value whose ``RemoteValue`` was collected
  (``weakref.finalize`` only queues it: no RPC from inside a GC callback).

A node and its ``TrackedCell`` are in ``dataflow_nodes.py``; submitting a node and
reading a kept value back (``Dataflow``) in ``dataflow.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from jaxcluster import errors
from jaxcluster._native import core
from jaxcluster.coordinator.dataflow_nodes import Node, TrackedCell

__all__ = ["Tracker"]

_log = logging.getLogger("jaxcluster.coordinator")
_NOT_READY = 0


class Tracker:
    """The dependency tracker of one coordinator (see the module docstring)."""

    def __init__(
        self,
        dispatcher: Any,
        submit: Callable[[Node, int | None], Any],
        node_of: Callable[[Any], Node | None],
        max_remakes: int | None,
    ) -> None:
        self._dispatcher = dispatcher
        # submit(node, worker): queues the node's closure (on `worker` when given) with its
        # inputs resolved; returns the Rust cell.
        self._submit = submit
        self._node_of = node_of
        self._max_remakes = 3 if max_remakes is None else max_remakes
        self._watch = core.CellWatch()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._waiting: list[Node] = []  # consumers whose producers have not all ended
        self._running: dict[int, Node] = {}  # closure id -> node whose cell is queued
        self._releases: list[tuple[int, int]] = []
        self._pending_error: BaseException | None = None
        self._stopped = False
        self.epoch = 0  # bumped by every submission (join's "nothing new" check)
        self._thread: threading.Thread | None = None

    # --- called by the coordinator ---------------------------------------------------

    def add(self, node: Node) -> None:
        """Tracks ``node``: submitted now if its producers ended, else once they have."""
        with self._lock:
            if self._stopped:
                raise RuntimeError("this ClusterCoordinator has been shut down")
            self._start()
            self._waiting.append(node)
            for producer in node.producers:
                cell = producer._cell
                if not isinstance(cell, TrackedCell) and cell.status == _NOT_READY:
                    cell.watch(self._watch)  # a plain producer: wake when it ends
        self._watch.wake()

    def add_running(self, node: Node, cell: Any) -> None:
        """Tracks a kept producer queued by ``schedule`` itself (it had no inputs)."""
        with self._lock:
            self._start()
            node.cell.attach(cell)
            self._running[cell.closure_id] = node
        cell.watch(self._watch)

    def release_later(self, node: Node) -> None:
        """``weakref.finalize`` callback of a kept value: queue its release (no RPC here)."""
        worker, value_id = node.holder(), node.value_id
        node.released = True
        if worker is None or value_id is None:
            return
        with self._lock:
            self._releases.append((worker, value_id))
        self._watch.wake()

    def take_pending_error(self) -> None:
        """Raises, once, a closure error the tracker's own queueing met (``cancel_all``)."""
        with self._lock:
            error, self._pending_error = self._pending_error, None
        if error is not None:
            raise error

    def idle(self) -> bool:
        with self._lock:
            return not self._waiting and not self._running and not self._releases

    def wait_idle(self, deadline: float | None) -> bool:
        """Waits until nothing is waiting or running here; ``False`` at ``deadline``."""
        with self._idle:
            while self._waiting or self._running:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining if remaining is None else min(remaining, 0.5))
        return True

    def stop(self) -> None:
        """Cancels every closure still waiting for its producers; ends the thread."""
        with self._lock:
            self._stopped = True
            waiting, self._waiting = self._waiting, []
            running, self._running = list(self._running.values()), {}
            self._idle.notify_all()
        why = "the closure was cancelled because the coordinator was shut down before it ran"
        for node in waiting:
            node.cell.finish(cancelled=why)
        for node in running:  # their Rust cells are cancelled by the dispatcher's shutdown
            node.cell.finish()
        self._watch.wake()

    # --- the thread --------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="jaxcluster-dataflow", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            settled = self._watch.wait(None)
            with self._lock:
                if self._stopped:
                    return
                releases, self._releases = self._releases, []
                finished = [self._running.pop(i) for i in settled if i in self._running]
            for worker, value_id in releases:
                self._dispatcher.release_value(worker, value_id)
            for node in finished:
                try:
                    self._settled(node)
                except Exception:  # never lose the thread: fail that closure instead
                    _log.exception("dataflow: settling closure %s failed", node.name)
                    node.cell.finish(error=errors.InternalError("dataflow bookkeeping failed"))
            self._submit_ready()
            with self._lock:
                if not self._waiting and not self._running:
                    self._idle.notify_all()

    def _settled(self, node: Node) -> None:
        """A node's Rust cell settled: final, or a lost kept input to re-make first."""
        result = node.cell._cell.result()
        kind = getattr(result, "kind", None)
        if kind == core.ErrorKind.INPUT:
            lost = self._kept_input(node, result.resource_id)
            if lost is not None and node.input_failures < self._max_remakes:
                node.input_failures += 1
                _log.info(
                    "dataflow: kept value %d of closure %s is gone (%s); re-making it",
                    lost.value_id,
                    lost.name,
                    result.message,
                )
                self._remake(lost)
                with self._lock:
                    self._waiting.append(node)
                return
        if kind == core.ErrorKind.INFRASTRUCTURE and getattr(result, "code", "") == "ABORTED":
            # Placed on its input's worker, which was removed or given up: run it anywhere,
            # re-making the inputs that worker held.
            lost_any = False
            for producer in node.producers:
                source = self._node_of(producer)
                if (
                    source is not None
                    and source.keep
                    and source.holder() == getattr(node, "placed_on", None)
                ):
                    self._remake(source)
                    lost_any = True
            if lost_any and node.input_failures < self._max_remakes:
                node.input_failures += 1
                with self._lock:
                    self._waiting.append(node)
                return
        node.cell.finish()

    def _kept_input(self, node: Node, value_id: int | None) -> Node | None:
        """The kept input an input error is about, by the error's ``resource_id`` (the
        worker names the kept value it could not read)."""
        if value_id is None:
            return None
        for producer in node.producers:
            source = self._node_of(producer)
            if source is not None and source.keep and source.value_id == value_id:
                return source
        return None

    def _remake(self, source: Node) -> None:
        """Runs a kept producer again (its value was lost), once per loss."""
        if not source.cell.final:
            return  # already being re-made
        if source.remakes >= self._max_remakes:
            return  # its consumers then fail with the input error they met
        source.remakes += 1
        source.cell.reopen()
        with self._lock:
            self._waiting.append(source)

    def remake_now(self, source: Node) -> None:
        """Re-makes a kept value a pull found gone (from the fetching thread)."""
        self._remake(source)
        self._watch.wake()

    def _submit_ready(self) -> None:
        """Submits or fails every waiting node whose producers all ended."""
        while True:
            with self._lock:
                ready = [n for n in self._waiting if all(self._ended(p) for p in n.producers)]
                if not ready:
                    return
                self._waiting = [n for n in self._waiting if n not in ready]
            for node in ready:
                self._resolve(node)

    def _ended(self, producer: Any) -> bool:
        cell = producer._cell
        if isinstance(cell, TrackedCell):
            return cell.final
        return bool(cell.status != _NOT_READY)

    def _resolve(self, node: Node) -> None:
        """Fails, cancels, re-makes inputs of, or submits a node whose producers ended."""
        for index, producer in enumerate(node.producers):
            if producer.status.value == "ABORTED":
                node.cell.finish(
                    cancelled=f"the closure was cancelled because its input {index}, the "
                    f"result of closure {self._label(producer)}, was cancelled"
                )
                return
            try:
                producer._error_only()
            except BaseException as exc:  # the producer failed: this input has an error
                error = errors.ClosureInputError(exc)
                error.args = (
                    f"input {index} of closure {node.name} is the result of closure "
                    f"{self._label(producer)}, which failed: {type(exc).__name__}: {exc}; the "
                    "closure that used it was not run",
                )
                error.__cause__ = exc
                node.cell.finish(error=error)
                return
        if self._dispatcher.failure_pending():
            node.cell.finish(
                cancelled="the closure was cancelled because another closure failed first "
                "(error_policy='cancel_all'); the first error was raised by schedule(), "
                "join() or done()"
            )
            return
        if self._lost_inputs(node):
            with self._lock:
                self._waiting.append(node)
            return
        worker = self._placement(node)
        try:
            cell = self._submit(node, worker)
        except errors.CancelledError as exc:
            node.cell.finish(cancelled=str(exc))
            return
        except Exception as exc:
            if isinstance(exc, RuntimeError) and "shut down" in str(exc):
                node.cell.finish(cancelled=str(exc))
                return
            # A pending closure error raised by the queue: this closure was cancelled with
            # the rest; the user sees the error from the next schedule/join/done.
            with self._lock:
                if self._pending_error is None:
                    self._pending_error = exc
            node.cell.finish(
                cancelled="the closure was cancelled because another closure failed first "
                "(error_policy='cancel_all')"
            )
            return
        node.placed_on = worker  # type: ignore[attr-defined]
        node.cell.attach(cell)
        with self._lock:
            self._running[cell.closure_id] = node
            self.epoch += 1
        cell.watch(self._watch)

    def _label(self, producer: Any) -> str:
        source = self._node_of(producer)
        cell = producer._cell
        closure_id = cell.closure_id
        name = source.name if source is not None else getattr(producer, "_name", "")
        return f"{closure_id} ({name})" if name else str(closure_id)

    def _lost_inputs(self, node: Node) -> bool:
        """Re-makes kept inputs whose holder is out of service; whether any was."""
        kept = [s for s in (self._node_of(p) for p in node.producers) if s is not None and s.keep]
        if not kept:
            return False
        states = {w.index: w.state for w in self._dispatcher.worker_statuses()}
        lost = False
        for source in kept:
            holder = source.holder()
            gone = holder is not None and states.get(holder) != core.WorkerState.UP
            if gone and source.remakes < self._max_remakes:
                self._remake(source)
                lost = True
        return lost

    def _placement(self, node: Node) -> int | None:
        """The holder of the most kept input bytes, if it is free; else ``None`` (any)."""
        held: dict[int, int] = {}
        for producer in node.producers:
            source = self._node_of(producer)
            holder = None if source is None or not source.keep else source.holder()
            if holder is not None:
                held[holder] = held.get(holder, 0) + int(producer._kept_info().nbytes) + 1
        if not held:
            return None
        best = max(held, key=lambda w: held[w])
        return best if self._dispatcher.worker_free(best) else None
