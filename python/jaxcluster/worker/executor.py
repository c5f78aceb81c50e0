"""The worker's executor loop: takes jobs from the Rust server and runs them.

The loop runs on one thread (the process's main thread in ``jaxcluster worker``), waiting
in ``WorkerServer.next_job`` with the GIL released, so the interpreter is free while the
worker is idle and a closure never competes with another for it. Every job is answered
exactly once, whatever happens while running it.

A trivial closure costs this loop about 10 us of CPU, so the path of a ``run`` job is kept
flat: one method, the current-worker index swapped without a context manager (a generator
costs 2 us), values through ``wire``'s C-pickler fast paths. Garbage collection was
measured and left alone: over 40,000 small-array closures a worker spent about 2 us per
closure in all three generations together (most of it at start-up, importing JAX), and
``gc.freeze()`` with a higher gen0 threshold changed the worker's CPU per closure by less
than the run-to-run noise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from jaxcluster import wire
from jaxcluster._native import core
from jaxcluster.worker.context import swap_current_index
from jaxcluster.worker.failures import describe_exception
from jaxcluster.worker.functions import FunctionCache, FunctionLoadError
from jaxcluster.worker.kept import KeptInputs, ValueReader, kept_info, lend
from jaxcluster.worker.resources import ResourceInputError, ResourceRegistry
from jaxcluster.worker.slice import broken, gather_output

__all__ = ["Executor"]


_INTERNAL = frozenset({__file__})

#: How long a preempted worker whose notice gave no deadline waits for preemption saves.
_SAVE_WAIT_WITHOUT_DEADLINE = 30.0
_log = logging.getLogger("jaxcluster.worker")


class _Answered(Exception):
    """Internal: preparing a job already answered it (with an error)."""


class Executor:
    """Runs the jobs a ``jaxcluster._core.WorkerServer`` hands out, one at a time.

    A ``run`` job with ``keep_result_id`` keeps its result in the registry and answers its
    :class:`~jaxcluster.wire.KeptInfo`; :class:`~jaxcluster.wire.KeptRef` arguments are
    resolved by :class:`~jaxcluster.worker.kept.KeptInputs` (``peer_unreachable``: why
    pulls from peers cannot work here, if they cannot), and a :class:`ValueReader` thread,
    started by :meth:`serve`, answers other workers' reads of kept values.

    On a host of a slice (``sliced``), every value is made local to the host before it is
    encoded (:func:`gather_output`, a collective all hosts run), only rank 0's value is
    sent, and rank 0 (given its ``fanout``) forwards each job to its peers and answers once
    they have answered too.

    Example::

        server = WorkerServer("127.0.0.1:0", worker_index=0)
        Executor(server, worker_index=0).serve()  # returns once shutdown has drained
    """

    def __init__(
        self,
        server: Any,
        worker_index: int,
        *,
        sliced: bool = False,
        fanout: Any = None,
        slice_check: Callable[[], str | None] | None = None,
        peer_unreachable: str | None = None,
    ) -> None:
        self._server = server
        self._index = worker_index
        self._sliced = sliced
        self._fanout = fanout
        # A peer (rank > 0) of a slice: its values stay on the host, rank 0 sends its own.
        self._peer = sliced and fanout is None
        self._slice_check = slice_check
        self._functions = FunctionCache()
        self._resources = ResourceRegistry(worker_index)
        # When a preempted worker stops waiting for preemption saves (seconds since the
        # epoch), fixed the first time it waits.
        self._save_until: float | None = None
        self._kept = KeptInputs(server, self._resources, worker_index, unreachable=peer_unreachable)
        self._reader = ValueReader(server, self._resources, worker_index)
        self.jobs_handled = 0

    def serve(self, poll_seconds: float = 0.5) -> None:
        """Handles jobs until the server has begun shutting down and has none left. Reads
        of kept values go on (another thread) until the server stops serving or
        :meth:`close`.

        A worker being preempted stays up after that while it holds
        ``on_preemption="save"`` state no preemption save has read yet, until the
        notice's deadline: its coordinators copy that state off it (see
        ``coordinator/device_state.py``)."""
        if not self._reader.started:
            self._reader.start()
        while True:
            job = self._server.next_job(poll_seconds)
            if job is None and self._server.draining:
                # Catch a job queued just before draining began (a resource release).
                job = self._server.next_job(0.0)
                if job is None:
                    left = self._save_window()
                    if left <= 0.0:
                        return
                    job = self._server.next_job(min(poll_seconds, left), while_draining=True)
            if job is not None:
                self.handle(job)

    def _save_window(self) -> float:
        """Seconds a draining worker still waits for preemption saves: until its notice's
        deadline while some live session's ``on_preemption="save"`` state was not read; 0
        otherwise (a session ended or vanished past its ``--state-ttl`` sends no save)."""
        status = self._server.status()
        if status.preemption_source is None:
            return 0.0  # drained without a notice (SIGINT, a shutdown): nothing to save for
        if not self._resources.awaiting_preemption_save({s.id for s in status.sessions}):
            return 0.0
        if self._save_until is None:
            deadline = status.preemption_deadline
            # A notice without a deadline: wait as long as a drain may take.
            self._save_until = deadline or time.time() + _SAVE_WAIT_WITHOUT_DEADLINE
        return self._save_until - time.time()

    def close(self) -> None:
        """Stops serving reads of kept values (call once the server stopped serving)."""
        self._reader.stop()

    def handle(self, job: Any) -> None:
        """Runs one job and answers it; a failure of the executor itself answers INTERNAL."""
        try:
            if job.kind == "run":
                self._run(job)
            elif job.kind == "create_resource":
                self._create(job)
            elif job.kind == "release_resource":
                pending = self._forward(job)
                released = self._resources.release(job.session, job.resource_ids)
                self._report(job.session)
                self._settle(pending)
                job.reply_ok(released=released)
            elif job.kind == "release_session":
                pending = self._forward(job)
                released = self._resources.release_session(job.session)
                self._report(job.session)
                self._settle(pending)
                job.reply_ok(released=released)
            else:
                job.reply_status("INTERNAL", f"this worker cannot handle jobs of kind {job.kind!r}")
        except _Answered:
            pass
        except BaseException as exc:
            if not job.replied:
                job.reply_status(
                    "INTERNAL",
                    f"worker {self._index} failed while handling a {job.kind} job: "
                    f"{type(exc).__name__}: {exc}",
                )
            if not isinstance(exc, Exception):
                raise
        finally:
            self.jobs_handled += 1

    def _fail(self, job: Any, kind: core.ErrorKind, exc: BaseException, **extra: Any) -> _Answered:
        job.reply_error(kind, **describe_exception(exc, _INTERNAL), **extra)
        return _Answered()

    def _prepare(self, job: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """Loads the function and decodes the arguments, answering the job on failure."""
        try:
            fn = self._functions.get(
                job.function_hash, job.function_kind, lambda: job.function_payload
            )
        except FunctionLoadError as exc:
            raise self._fail(job, core.ErrorKind.FUNCTION_LOAD, exc) from None
        pickled = job.args
        if pickled is None:
            return fn, (), {}
        try:
            session = job.session
            resources = self._resources
            decoded = wire.decode(
                pickled,
                job.buffers,
                resolve_resource=lambda rid: resources.resolve(session, rid),
                resolve_kept=self._kept.resolver(session),
            )
        except ResourceInputError as exc:
            raise self._fail(
                job, core.ErrorKind.INPUT, exc.original, resource_id=exc.resource_id
            ) from None
        except Exception as exc:
            job.reply_status(
                "INVALID_ARGUMENT",
                f"worker {self._index} could not unpickle the closure's arguments: "
                f"{type(exc).__name__}: {exc}",
            )
            raise _Answered() from None
        if (
            isinstance(decoded, tuple)
            and len(decoded) == 2
            and isinstance(decoded[0], (tuple, list))
            and isinstance(decoded[1], dict)
        ):
            return fn, tuple(decoded[0]), decoded[1]
        job.reply_status(
            "INVALID_ARGUMENT",
            "the closure's arguments unpickled to "
            f"{type(decoded).__qualname__}; expected a tuple (args, kwargs) of a "
            "tuple and a dict",
        )
        raise _Answered()

    def _call(self, job: Any) -> Any:
        fn, args, kwargs = self._prepare(job)
        # The coordinator's index for this worker when it sent one (it changes as workers
        # join and leave), else this worker's --index.
        index = job.worker_index
        previous = swap_current_index(self._index if index is None else index)
        try:
            return fn(*args, **kwargs)
        finally:
            swap_current_index(previous)

    def _check_slice(self) -> None:
        """Ends this process (the slice broke) if a host it watches is gone."""
        if self._slice_check is not None:
            reason = self._slice_check()
            if reason is not None:
                broken(reason)

    def _forward(self, job: Any) -> Any:
        if self._fanout is None:
            return None
        # After a notice rank 0 runs only preemption saves (and the closure it was running):
        # forwarded as saves, so a peer draining for its own notice runs them too.
        save = self._server.draining and self._server.status().preemption_source is not None
        return self._fanout.send(job, preemption_save=save)

    def _settle(self, pending: Any, *, failed: bool = False) -> Any:
        """Waits for the peers' parts of a job rank 0 forwarded; their first error."""
        return None if pending is None else self._fanout.wait(pending, local_failed=failed)

    def _run(self, job: Any) -> None:
        if self._sliced:
            self._run_sliced(job)
            return
        try:
            result = self._call(job)
            keep = job.keep_result_id
            if keep is not None:
                result = self._keep(job, keep, result)
            encoded = wire.encode(result, zero_copy=True)
        except _Answered:
            raise
        except Exception as exc:
            raise self._fail(job, core.ErrorKind.USER, exc) from None
        job.reply_ok(encoded.pickle, encoded.buffers)

    def _keep(self, job: Any, value_id: int, result: Any) -> wire.KeptInfo:
        """Keeps ``result`` as ``value_id`` of the job's session; what to answer instead."""
        info = kept_info(result)
        self._resources.put(job.session, value_id, lend(result), kept=True)
        self._report(job.session)
        return info

    def _run_sliced(self, job: Any) -> None:
        pending = self._forward(job)
        try:
            result = gather_output(self._call(job))
            keep = job.keep_result_id
            if keep is not None and not self._peer:  # rank 0 keeps it, as a resource
                result = self._keep(job, keep, result)
            encoded = wire.encode(None if self._peer else result, zero_copy=True)
        except _Answered:
            self._settle(pending, failed=True)
            raise
        except Exception as exc:
            # A collective fails fast when a host of the slice died: that is the slice's
            # failure (the closure runs again elsewhere), not the closure's. Ask first.
            self._check_slice()
            self._settle(pending, failed=True)
            raise self._fail(job, core.ErrorKind.USER, exc) from None
        peer_error = self._settle(pending)
        if peer_error is not None:
            job.reply_error(**peer_error.reply_kwargs())
            return
        job.reply_ok(encoded.pickle, encoded.buffers)

    def _report(self, session: str) -> None:
        """Tells the server what ``session`` holds now (``GetStatus`` shows it)."""
        if session:
            held = self._resources.held(session)
            self._server.set_session_held(
                session, values=held.values, bytes=held.bytes, named=held.named
            )

    def _create(self, job: Any) -> None:
        name = job.name
        if name:
            came_from = self._resources.adopt(job.session, job.resource_id, name)
            if came_from is not None:
                self._adopted(job, name, came_from)
                return
        pending = self._forward(job)
        try:
            value = self._call(job)
        except _Answered:
            self._settle(pending, failed=True)
            raise
        except Exception as exc:
            if self._sliced:
                self._check_slice()
            self._settle(pending, failed=True)
            self._resources.fail(job.session, job.resource_id, exc)
            raise self._fail(job, core.ErrorKind.USER, exc) from None
        self._resources.put(job.session, job.resource_id, value, name)
        self._report(job.session)
        peer_error = self._settle(pending)
        if peer_error is not None:
            job.reply_error(**peer_error.reply_kwargs())
            return
        job.reply_ok()

    def _adopted(self, job: Any, name: str, came_from: str) -> None:
        """Answers a named ``create_resource`` whose value was found alive: no function
        runs; a slice's peers adopt theirs too (they hold the same name)."""
        pending = self._forward(job)
        self._settle(pending)
        if came_from and came_from != job.session:
            self._report(came_from)
        self._report(job.session)
        _log.info(
            "worker %d: named state %r re-attached to session %s (held by session %s)",
            self._index,
            name,
            job.session,
            came_from or "<anonymous>",
        )
        job.reply_ok(reattached=True)
