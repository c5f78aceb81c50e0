"""TF 2.21 ``distribute/coordinator/cluster_coordinator_test.py``, class
``CoordinatedClosureQueueTest``: every behaviour it asserts of TF's ``_CoordinatedClosureQueue``,
asserted against ``jaxcluster.coordinator.ClosureQueue``. TF's closures carry a
``RemoteValue``; here a small closure records its cancellation and its error, which is all the
queue does to a closure. The ordering checks wait on events with deadlines, never on sleeps."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

import pytest

from jaxcluster.coordinator import ClosureQueue
from jaxcluster.errors import CancelledError

DEADLINE = 60.0


class Closure:
    """A queued function; the queue calls ``mark_cancelled`` when it drops it."""

    def __init__(self, fn: Callable[[], object] = lambda: 1.0) -> None:
        self.fn = fn
        self.cancelled = False
        self.error: BaseException | None = None

    def mark_cancelled(self) -> None:
        self.cancelled = True

    def fetch(self) -> object:
        if self.error is not None:
            raise self.error
        if self.cancelled:
            raise CancelledError("the function was cancelled; schedule it again")
        return self.fn()


def _in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # reported to the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _join(thread: threading.Thread, errors: list[BaseException]) -> None:
    thread.join(DEADLINE)
    assert not thread.is_alive(), "helper thread did not finish"
    if errors:
        raise errors[0]


def _assert_second_waits_for_first(first: Callable[[], None], second: Callable[[], None]) -> None:
    """``second`` (this thread) returns only after ``first`` (another thread) has finished."""
    first_done, second_done = threading.Event(), threading.Event()

    def run_first() -> None:
        assert not second_done.is_set()
        first()
        first_done.set()

    thread, errors = _in_thread(run_first)
    second()
    assert first_done.is_set()
    second_done.set()
    _join(thread, errors)


def test_basic() -> None:
    queue = ClosureQueue()
    closure = Closure()
    queue.put(closure)
    assert queue.get() is closure
    assert not queue.done()
    queue.put_back(closure)
    assert queue.get() is closure
    queue.mark_finished()
    assert queue.done()
    assert queue.wait()


def test_every_closure_runs_at_least_once_and_wait_can_repeat() -> None:
    queue = ClosureQueue()
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def process() -> None:
        put_back_once = False
        while True:
            closure = queue.get(timeout=DEADLINE)
            if closure is None:
                return
            if not put_back_once:
                put_back_once = True
                queue.put_back(closure)
                continue
            closure.fn()
            queue.mark_finished()

    def counting(label: str) -> Callable[[], None]:
        def fn() -> None:
            with lock:
                counts[label] += 1

        return fn

    labels = ["A", "B", "C", "D", "E"]
    for label in labels:
        queue.put(Closure(counting(label)))
    workers = [_in_thread(process) for _ in range(2)]
    for _ in range(4):
        assert queue.wait(DEADLINE)
    assert counts == collections.Counter(labels)
    queue.stop()
    for thread, errors in workers:
        _join(thread, errors)


def test_wait_after_the_work_is_done_returns() -> None:
    queue = ClosureQueue()
    queue.put(Closure())
    thread, errors = _in_thread(lambda: (queue.get(), queue.mark_finished()))
    _join(thread, errors)
    assert queue.wait(DEADLINE)


def test_wait_raises_a_failure_only_once_the_inflight_closure_ends() -> None:
    queue = ClosureQueue()
    queue.put(Closure())
    queue.get()

    def fail() -> None:
        queue.mark_failed(ValueError("Some error."))

    def wait() -> None:
        with pytest.raises(ValueError):
            queue.wait(DEADLINE)

    _assert_second_waits_for_first(fail, wait)
    assert queue.done()


def _two_put_one_got() -> tuple[ClosureQueue, Closure, Closure]:
    queue = ClosureQueue()
    first, second = Closure(), Closure()
    queue.put(first)
    queue.put(second)
    got = queue.get()
    assert got is first and got is not second
    return queue, first, second


def test_put_raises_the_failure_and_cancels_the_queued() -> None:
    queue, _, second = _two_put_one_got()
    queue.mark_failed(ValueError())
    with pytest.raises(ValueError):
        queue.put(Closure())
    assert queue.done()
    with pytest.raises(CancelledError):
        second.fetch()
    queue.put(Closure())  # the failure was cleared


def test_wait_raises_the_failure_and_cancels_the_queued() -> None:
    queue, _, second = _two_put_one_got()
    queue.mark_failed(ValueError())
    with pytest.raises(ValueError):
        queue.wait(DEADLINE)
    assert queue.done()
    with pytest.raises(CancelledError):
        second.fetch()
    assert queue.wait(DEADLINE)  # the failure was cleared


def test_done_raises_the_failure() -> None:
    queue, _, _ = _two_put_one_got()
    assert not queue.done()
    queue.mark_failed(ValueError())
    with pytest.raises(ValueError):
        queue.done()


@pytest.mark.parametrize("call_wait", [True, False])
def test_the_first_failure_is_raised_after_the_inflight_closures_end(call_wait: bool) -> None:
    queue, first, second = _two_put_one_got()
    queue.put(Closure())
    queue.get()
    assert queue.inflight == 2

    first.error = ValueError("Some error.")
    queue.mark_failed(first.error)
    assert (len(queue), queue.inflight) == (1, 1)
    third = Closure()

    def second_is_cancelled_by_hand() -> None:
        second.error = ValueError("Fake cancellation error.")
        queue.mark_failed(second.error)

    def raises_the_first_failure() -> None:
        with pytest.raises(ValueError, match=r"Some error\."):
            if call_wait:
                queue.wait(DEADLINE)
            else:
                queue.put(third)

    _assert_second_waits_for_first(second_is_cancelled_by_hand, raises_the_first_failure)
    assert (len(queue), queue.inflight) == (0, 0)
    assert queue.done()  # nothing pending: the failure was cleared
    with pytest.raises(ValueError, match=r"Some error\."):
        first.fetch()
    if not call_wait:
        with pytest.raises(CancelledError):
            third.fetch()
    with pytest.raises(ValueError, match=r"Fake cancellation error\."):
        second.fetch()
    test_basic()  # and the queue works as new


def test_the_failure_is_cleared_once_raised() -> None:
    queue, _, _ = _two_put_one_got()
    assert queue.inflight == 1
    queue.mark_failed(ValueError("test error"))
    with pytest.raises(ValueError):
        queue.put(Closure())
    queue.put(Closure())
    assert queue.done() is False


def test_thread_safety() -> None:
    queue = ClosureQueue()
    threads, actions = 10, 20

    def work() -> None:
        for i in range(actions):
            closure = queue.get(timeout=DEADLINE)
            assert closure is not None
            if i % 2 == 0:
                queue.put_back(closure)
            else:
                queue.mark_finished()

    workers = [_in_thread(work) for _ in range(threads)]
    for _ in range(threads * actions // 2):
        queue.put(Closure())
    assert queue.wait(DEADLINE)
    assert queue.done()
    for thread, errors in workers:
        _join(thread, errors)


def test_tagged_closures() -> None:
    queue = ClosureQueue()
    first, second, third = Closure(), Closure(), Closure()

    def put() -> None:
        queue.put(third, tag=1)
        queue.put(second, tag=2)
        queue.put(first)

    thread, errors = _in_thread(put)
    assert queue.get(timeout=DEADLINE, tag=2) is second  # only the closure tagged 2
    _join(thread, errors)

    assert not queue.done()
    assert queue.get() is first
    queue.mark_finished()
    assert queue.done()  # the closure tagged 1 is not waited for
    assert queue.wait(DEADLINE)
