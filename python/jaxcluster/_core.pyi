"""Type stubs for the native module ``jaxcluster._core`` (Rust, PyO3)."""

from typing import Any, Protocol, final

__version__: str

# --- closure queue (rust/py/queue.rs) ---------------------------------------------------

class _Cancellable(Protocol):
    def mark_cancelled(self) -> None: ...

@final
class ClosureQueue:
    """TF's ``_CoordinatedClosureQueue`` in Rust: a bounded, thread-safe queue of closures.

    Closures are any objects with a ``mark_cancelled()`` method. ``get()`` hands one out and
    counts it *inflight* until the consumer calls exactly one of ``mark_finished()``,
    ``mark_failed(exc)`` or ``put_back(closure)``. The first failure is kept and raised, as
    the very exception object given to ``mark_failed``, by the next ``put``, ``wait`` or
    ``done``: before raising, every queued closure is cancelled (``mark_cancelled()``) and
    the inflight ones are waited for; then the error is cleared and the queue is usable
    again. Every blocking call releases the GIL and stays interruptible with Ctrl-C.

    Per-worker sub-queues: a closure put with ``tag=i`` is only handed to ``get(tag=i)``,
    which prefers it over the global queue; tagged closures are never inflight and never
    waited for.

    Example::

        from jaxcluster.coordinator import ClosureQueue

        queue = ClosureQueue(max_size=1024)
        queue.put(closure)              # blocks while full
        c = queue.get(timeout=1.0)      # None on timeout or after stop()
        try:
            c.run()
        except Exception as e:
            queue.mark_failed(e)        # raised later by put/wait/done
        else:
            queue.mark_finished()
        queue.wait()                    # True once nothing is queued or inflight
    """

    def __new__(cls, max_size: int = 262144) -> ClosureQueue:
        """Creates a queue holding at most ``max_size`` untagged closures (``<= 0``: no bound)."""

    def put(self, closure: _Cancellable, tag: int | None = None) -> None:
        """Queues ``closure``; with ``tag``, on that worker's sub-queue instead.

        Blocks while the queue is full or a ``wait()`` is in progress. If a closure failed
        earlier, ``closure`` is queued and then cancelled with everything else queued, and
        that failure is raised. After ``stop()`` the closure is cancelled and
        ``jaxcluster.errors.CancelledError`` is raised. A tagged put never blocks or raises
        the pending error.
        """

    def get(self, timeout: float | None = None, tag: int | None = None) -> Any:
        """Returns the next closure, or ``None`` after ``timeout`` seconds or once stopped.

        With ``tag``, that worker's sub-queue is served first. An untagged closure counts
        as inflight until ``mark_finished``, ``mark_failed`` or ``put_back``.
        """

    def put_back(self, closure: _Cancellable) -> None:
        """Returns an inflight closure that could not run to the tail of the queue.

        Cancels it instead if a failure is pending or the queue was stopped. Never blocks (the
        queue may exceed ``max_size`` by the closures put back). ``AssertionError`` if
        nothing is inflight.
        """

    def mark_finished(self) -> None:
        """Records that an inflight closure finished. ``AssertionError`` if none is inflight."""

    def mark_failed(self, exc: BaseException) -> None:
        """Records that an inflight closure failed with ``exc``; the first failure wins.

        ``AssertionError`` if none is inflight.
        """

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until nothing is queued or inflight: ``True``, or ``False`` on timeout.

        Raises the pending failure instead (see the class documentation). No ``put`` starts
        while a wait is in progress.
        """

    def done(self) -> bool:
        """Whether nothing is queued or inflight; raises the pending failure if any."""

    def stop(self) -> None:
        """Wakes every blocked ``get`` (which returns ``None``) and ``put`` (which raises
        ``CancelledError``) and cancels every closure still queued. Idempotent."""

    def __len__(self) -> int:
        """Untagged closures queued right now."""

    @property
    def inflight(self) -> int:
        """Untagged closures handed out and not yet finished, failed or put back."""

    @property
    def max_size(self) -> int:
        """The ``max_size`` given to the constructor."""
