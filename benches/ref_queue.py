"""A pure-Python closure queue with TensorFlow's ``_CoordinatedClosureQueue`` algorithm.

The baseline ``queue_bench.py`` compares ``jaxcluster.coordinator.ClosureQueue`` against:
one lock, condition variables on it, a ``deque`` per queue, and a second lock that keeps
``put`` and ``wait`` apart, as TF does. Same Python API as the Rust queue.

Example::

    q = ReferenceClosureQueue(max_size=8)
    q.put(closure)
    c = q.get(timeout=1.0)
    q.mark_finished()
    assert q.wait()
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from typing import Any, Protocol


class Cancellable(Protocol):
    def mark_cancelled(self) -> None: ...


class ReferenceClosureQueue:
    """TF's closure-queue algorithm in plain Python (see the module docstring)."""

    def __init__(self, max_size: int = 262144) -> None:
        self._max_size = max_size
        self._lock = threading.Lock()
        self._put_wait_lock = threading.Lock()
        self._queued = threading.Condition(self._lock)
        self._slot_free = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._no_inflight = threading.Condition(self._lock)
        self._queue: deque[Any] = deque()
        self._tagged: defaultdict[int, deque[Any]] = defaultdict(deque)
        self._inflight = 0
        self._error: BaseException | None = None
        self._running = True

    def _full(self) -> bool:
        return 0 < self._max_size <= len(self._queue)

    def put(self, closure: Cancellable, tag: int | None = None) -> None:
        if tag is not None:
            with self._lock:
                self._tagged[tag].append(closure)
                self._queued.notify_all()
            return
        with self._put_wait_lock, self._lock:
            self._slot_free.wait_for(lambda: not self._full())
            self._queue.append(closure)
            self._raise_if_error()
            self._queued.notify()

    def get(self, timeout: float | None = None, tag: int | None = None) -> Any:
        with self._lock:
            while self._running and not self._queue and (tag is None or not self._tagged[tag]):
                if not self._queued.wait(timeout):
                    return None
            if not self._running:
                return None
            if tag is not None and self._tagged[tag]:
                return self._tagged[tag].popleft()
            closure = self._queue.popleft()
            self._slot_free.notify()
            self._inflight += 1
            return closure

    def _settle(self, what: str) -> None:
        if self._inflight < 1:
            raise AssertionError(f"{what}() called with no closure inflight")
        self._inflight -= 1
        if self._inflight == 0:
            self._no_inflight.notify_all()

    def mark_finished(self) -> None:
        with self._lock:
            self._settle("mark_finished")
            if not self._queue and self._inflight == 0:
                self._idle.notify_all()

    def mark_failed(self, exc: BaseException) -> None:
        with self._lock:
            self._settle("mark_failed")
            if self._error is None:
                self._error = exc
            self._idle.notify_all()

    def put_back(self, closure: Cancellable) -> None:
        with self._lock:
            if self._inflight < 1:
                raise AssertionError("put_back() called with no closure inflight")
            if self._error is not None:
                closure.mark_cancelled()
            else:
                self._slot_free.wait_for(lambda: not self._full())
                self._queue.append(closure)
                self._queued.notify()
            self._settle("put_back")

    def wait(self, timeout: float | None = None) -> bool:
        with self._put_wait_lock, self._lock:
            while self._error is None and (self._queue or self._inflight > 0):
                if not self._idle.wait(timeout):
                    return False
            self._raise_if_error()
            return True

    def done(self) -> bool:
        with self._lock:
            self._raise_if_error()
            return not self._queue and self._inflight == 0

    def stop(self) -> None:
        with self._lock:
            self._running = False
            self._queued.notify_all()

    def _raise_if_error(self) -> None:
        # Called with the lock held, as in TF.
        if self._error is None:
            return
        while self._inflight > 0:
            self._no_inflight.wait()
        while self._queue:
            self._queue.popleft().mark_cancelled()
            self._slot_free.notify()
        error, self._error = self._error, None
        raise error

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def max_size(self) -> int:
        return self._max_size
