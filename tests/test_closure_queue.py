"""ClosureQueue semantics from Python (SPEC §5): put/get/put_back, inflight accounting,
the pending error, the bound, stop, tagged sub-queues, misuse and Ctrl-C."""

from __future__ import annotations

import _thread
import linecache
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from jaxcluster.coordinator import ClosureQueue
from jaxcluster.errors import CancelledError

DEADLINE = 30.0  # seconds; only ever reached when the code under test is broken


class Closure:
    """A stand-in closure that records its cancellation."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cancelled = threading.Event()
        self.cancel_calls = 0

    def mark_cancelled(self) -> None:
        self.cancel_calls += 1
        self.cancelled.set()

    def __repr__(self) -> str:
        return f"Closure({self.name!r})"


class Boom(Exception):
    """The failure a closure reports."""


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Runs ``fn`` in a daemon thread; the dict receives ``result`` or ``error``."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = fn()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def joined(thread: threading.Thread) -> None:
    thread.join(DEADLINE)
    assert not thread.is_alive(), f"{thread.name} still blocked after {DEADLINE}s"


def test_put_get_mark_finished_done_and_wait() -> None:
    q = ClosureQueue()
    assert q.max_size == 262144
    assert q.done() and q.wait(timeout=0)
    a, b = Closure("a"), Closure("b")
    q.put(a)
    q.put(b)
    assert len(q) == 2 and not q.done()
    assert q.get() is a
    assert (len(q), q.inflight) == (1, 1)
    q.mark_finished()
    assert q.get(timeout=0) is b
    assert not q.wait(timeout=0.01), "b is inflight"
    q.mark_finished()
    assert q.done() and q.wait()
    assert q.get(timeout=0.01) is None
    assert not a.cancelled.is_set() and not b.cancelled.is_set()
    assert "inflight=0" in repr(q)


def test_put_back_requeues_at_the_tail() -> None:
    q = ClosureQueue(8)
    closures = [Closure(str(i)) for i in range(3)]
    for c in closures:
        q.put(c)
    q.put_back(q.get())
    assert q.inflight == 0
    assert [q.get(), q.get(), q.get()] == [closures[1], closures[2], closures[0]]


def test_at_least_once_with_put_backs_from_several_consumers() -> None:
    q = ClosureQueue(16)
    closures = [Closure(str(i)) for i in range(300)]
    runs: dict[str, int] = {c.name: 0 for c in closures}
    lock = threading.Lock()

    def consume() -> None:
        while (c := q.get(timeout=DEADLINE)) is not None:
            with lock:
                runs[c.name] += 1
                attempt = runs[c.name]
            if attempt == 1 and int(c.name) % 3 == 0:
                q.put_back(c)  # "the worker went away": must run again elsewhere
            else:
                q.mark_finished()

    consumers = [in_thread(consume)[0] for _ in range(4)]
    for c in closures:
        q.put(c)
    assert q.wait(timeout=DEADLINE)
    q.stop()
    for thread in consumers:
        joined(thread)
    for c in closures:
        expected = 2 if int(c.name) % 3 == 0 else 1
        assert runs[c.name] == expected, c
        assert not c.cancelled.is_set()


def test_no_lost_wakeup_when_the_closure_finishes_around_wait() -> None:
    q = ClosureQueue(4)
    # Finished before wait() starts.
    q.put(Closure("early"))
    q.get()
    q.mark_finished()
    assert q.wait(timeout=DEADLINE) is True
    # Finished by another thread racing with wait(), many times over.
    for i in range(200):
        q.put(Closure(str(i)))
        c = q.get()
        thread, _ = in_thread(q.mark_finished)
        assert q.wait(timeout=DEADLINE) is True, f"round {i}: {c}"
        joined(thread)


def test_wait_raises_the_first_error_after_cancelling_queued_and_waiting_for_inflight() -> None:
    q = ClosureQueue(8)
    failing, slow, queued = Closure("failing"), Closure("slow"), Closure("queued")
    for c in (failing, slow, queued):
        q.put(c)
    assert q.get() is failing and q.get() is slow
    first, second = Boom("first"), Boom("second")
    q.mark_failed(first)
    slow_settled = threading.Event()
    settled_when_wait_ended: list[bool] = []

    def waiter() -> bool:
        try:
            return q.wait()
        finally:
            settled_when_wait_ended.append(slow_settled.is_set())

    thread, outcome = in_thread(waiter)
    assert queued.cancelled.wait(DEADLINE), "raising must cancel the queued closure first"
    slow_settled.set()
    q.mark_failed(second)  # the slow one fails too: the first error still wins
    joined(thread)
    assert outcome["error"] is first, "the very exception object given to mark_failed"
    assert settled_when_wait_ended == [True], "raised before the inflight closure settled"
    assert not failing.cancelled.is_set() and not slow.cancelled.is_set()
    # The error is cleared and the queue is reusable.
    assert q.done() and q.wait(timeout=0)
    again = Closure("again")
    q.put(again)
    assert q.get() is again


def test_put_enqueues_then_raises_so_the_closure_just_put_is_cancelled() -> None:
    q = ClosureQueue(8)
    failing, queued, new = Closure("failing"), Closure("queued"), Closure("new")
    q.put(failing)
    q.put(queued)
    q.get()
    error = Boom("boom")
    q.mark_failed(error)
    with pytest.raises(Boom) as raised:
        q.put(new)
    assert raised.value is error
    assert queued.cancel_calls == 1 and new.cancel_calls == 1
    assert (len(q), q.inflight) == (0, 0)
    q.put(Closure("after"))  # cleared: the next put is queued normally
    assert len(q) == 1


def test_done_raises_the_pending_error_once() -> None:
    q = ClosureQueue(8)
    q.put(Closure("a"))
    q.put(Closure("b"))
    q.get()
    q.get()
    q.mark_failed(Boom("first"))
    q.mark_failed(Boom("second"))
    with pytest.raises(Boom, match="first"):
        q.done()
    assert q.done() is True


def test_put_back_with_an_error_pending_cancels_the_closure() -> None:
    q = ClosureQueue(8)
    a, b = Closure("a"), Closure("b")
    q.put(a)
    q.put(b)
    q.get()
    q.get()
    q.mark_failed(Boom("boom"))
    q.put_back(b)
    assert b.cancel_calls == 1 and q.inflight == 0 and len(q) == 0


def test_a_bounded_queue_blocks_the_producer_until_a_slot_frees() -> None:
    q = ClosureQueue(max_size=1)
    first, second = Closure("first"), Closure("second")
    q.put(first)
    producing = threading.Event()
    taken = threading.Event()

    def produce() -> bool:
        producing.set()
        q.put(second)
        return taken.is_set()  # the put may only return once a slot was freed

    thread, outcome = in_thread(produce)
    assert producing.wait(DEADLINE)
    assert len(q) == 1
    taken.set()
    assert q.get() is first
    joined(thread)
    assert outcome == {"result": True}
    assert len(q) == 1 and q.get(timeout=0) is second


def test_an_error_releases_a_producer_blocked_on_a_full_queue() -> None:
    q = ClosureQueue(max_size=1)
    q.put(Closure("running"))
    q.get()
    queued, blocked = Closure("queued"), Closure("blocked")
    q.put(queued)
    # Whether the put is already blocked or not, it must end the same way.
    thread, outcome = in_thread(lambda: q.put(blocked))
    error = Boom("boom")
    q.mark_failed(error)
    joined(thread)
    assert outcome["error"] is error
    assert queued.cancel_calls == 1 and blocked.cancel_calls == 1


def test_stop_wakes_blocked_getters_and_putters() -> None:
    q = ClosureQueue(max_size=1)
    getters = [in_thread(lambda: q.get()) for _ in range(3)]
    tagged_getter = in_thread(lambda: q.get(tag=1))
    q.stop()
    for thread, outcome in [*getters, tagged_getter]:
        joined(thread)
        assert outcome == {"result": None}

    q = ClosureQueue(max_size=1)
    queued, blocked = Closure("queued"), Closure("blocked")
    q.put(queued)
    thread, outcome = in_thread(lambda: q.put(blocked))
    q.stop()  # whether the put is blocked yet or not, it must end cancelled
    joined(thread)
    assert isinstance(outcome["error"], CancelledError)
    assert "stopped" in str(outcome["error"])
    assert queued.cancel_calls == 1 and blocked.cancel_calls == 1
    late = Closure("late")
    with pytest.raises(CancelledError):
        q.put(late)
    assert late.cancel_calls == 1
    assert q.get(timeout=0) is None and len(q) == 0


@pytest.mark.parametrize("method", ["mark_finished", "mark_failed", "put_back"])
def test_settling_with_nothing_inflight_is_an_assertion_error(method: str) -> None:
    q = ClosureQueue(4)
    q.put(Closure("queued"))
    args: dict[str, tuple[object, ...]] = {
        "mark_finished": (),
        "mark_failed": (Boom("x"),),
        "put_back": (Closure("stray"),),
    }
    with pytest.raises(AssertionError, match=rf"{method}\(\).*inflight=0"):
        getattr(q, method)(*args[method])
    assert (len(q), q.inflight) == (1, 0)
    assert q.done() is False, "the misuse must not have recorded an error"


def test_bad_arguments_are_rejected_with_what_was_seen() -> None:
    q = ClosureQueue(4)
    with pytest.raises(TypeError, match=r"mark_cancelled\(\).*got 42 of type int"):
        q.put(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        q.put(Closure("y"), tag="worker-1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"timeout.*got -1"):
        q.get(timeout=-1)
    with pytest.raises(ValueError, match=r"timeout.*got nan"):
        q.wait(timeout=float("nan"))
    q.put(Closure("x"))
    q.get()
    with pytest.raises(TypeError, match=r"got 'boom' of type str"):
        q.mark_failed("boom")  # type: ignore[arg-type]
    assert q.inflight == 1, "the rejected mark_failed left the closure inflight"
    assert len(q) == 0


def test_closure_types_are_checked_each_time_they_change() -> None:
    q = ClosureQueue(0)
    q.put(Closure("a"))  # a valid class, remembered

    class Plain:
        pass

    with pytest.raises(TypeError, match="of type Plain"):
        q.put(Plain())  # type: ignore[arg-type]
    on_instance = Plain()
    on_instance.mark_cancelled = lambda: None  # type: ignore[attr-defined]
    q.put(on_instance)  # type: ignore[arg-type]  # a method set on the instance counts too
    q.put(Closure("b"))
    with pytest.raises(TypeError, match="of type Plain"):
        q.put_back(Plain())  # type: ignore[arg-type]
    assert len(q) == 3


def test_max_size_zero_or_negative_means_unbounded() -> None:
    for size in (0, -1):
        q = ClosureQueue(size)
        for i in range(2000):
            q.put(Closure(str(i)))
        assert len(q) == 2000 and q.max_size == size


def test_tagged_sub_queues_are_served_first_and_never_inflight_or_waited_for() -> None:
    q = ClosureQueue(4)
    untagged, mine, other = Closure("untagged"), Closure("mine"), Closure("other")
    q.put(untagged)
    q.put(mine, tag=3)
    q.put(other, tag=4)
    assert len(q) == 1, "len counts the global queue only"
    assert q.get(tag=3) is mine
    assert q.inflight == 0
    assert q.wait(timeout=0) is False, "the untagged closure is still queued"
    assert q.get(tag=3) is untagged and q.inflight == 1
    q.mark_finished()
    assert q.wait(timeout=0) is True, "a tagged closure is never waited for"
    assert q.get(timeout=0) is None, "an untagged getter never sees tagged closures"
    assert q.get(tag=4) is other
    # A blocked tagged getter wakes for its tag.
    thread, outcome = in_thread(lambda: q.get(timeout=DEADLINE, tag=7))
    late = Closure("late")
    q.put(late, tag=7)
    joined(thread)
    assert outcome["result"] is late


def test_a_failing_mark_cancelled_does_not_stop_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reported: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    class Faulty(Closure):
        def mark_cancelled(self) -> None:
            super().mark_cancelled()
            raise RuntimeError("cannot cancel")

    q = ClosureQueue(8)
    q.put(Closure("running"))
    q.get()
    faulty, fine = Faulty("faulty"), Closure("fine")
    q.put(faulty)
    q.put(fine)
    q.mark_failed(Boom("boom"))
    with pytest.raises(Boom):
        q.done()
    assert faulty.cancel_calls == 1 and fine.cancel_calls == 1
    assert [type(r.exc_value) for r in reported] == [RuntimeError]
    assert reported[0].object is faulty


def _interrupt_when_main_blocks_in_get(trigger: Callable[[], None]) -> threading.Thread:
    """Fires ``trigger`` once the main thread's current line is the blocked ``get()``."""
    main = threading.main_thread().ident
    assert main is not None
    target = sys._getframe(1)

    def watch() -> None:
        poll = threading.Event()  # never set: its wait() is a deadline-bounded pause
        for _ in range(int(DEADLINE / 0.001)):
            frame = sys._current_frames().get(main)
            if frame is target and "q.get(" in _source_line(frame):
                trigger()
                return
            poll.wait(0.001)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _source_line(frame: Any) -> str:
    return linecache.getline(frame.f_code.co_filename, frame.f_lineno)


@pytest.mark.timeout(60)  # a get() that cannot be interrupted blocks forever
@pytest.mark.parametrize(
    "trigger",
    [_thread.interrupt_main, lambda: signal.raise_signal(signal.SIGINT)],
    ids=["interrupt_main", "raise_signal"],
)
def test_ctrl_c_interrupts_a_get_blocked_in_the_main_thread(trigger: Callable[[], None]) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not handled by Python's default handler here")
    q = ClosureQueue(4)
    watcher = _interrupt_when_main_blocks_in_get(trigger)
    with pytest.raises(KeyboardInterrupt):
        q.get()
    joined(watcher)
    # The queue is intact afterwards.
    c = Closure("after")
    q.put(c)
    assert q.get(timeout=0) is c
