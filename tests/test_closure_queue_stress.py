"""ClosureQueue under many Python threads at once: producers, consumers that randomly put
back and fail closures, tagged per-worker closures, and joiners calling wait()/done().
Every closure must end exactly once: finished, failed or cancelled."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from jaxcluster.coordinator import ClosureQueue

DEADLINE = 60.0  # seconds; only ever reached when the code under test is broken
PRODUCERS = 4
CONSUMERS = 6
JOINERS = 2
PER_PRODUCER = 1500


class Failure(Exception):
    """What a closure reports when it fails."""


class Ledger:
    """How each closure ended; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ends: Counter[tuple[str, int]] = Counter()
        self.runs: Counter[int] = Counter()

    def record(self, how: str, ident: int) -> None:
        with self._lock:
            self.ends[how, ident] += 1

    def ran(self, ident: int) -> int:
        with self._lock:
            self.runs[ident] += 1
            return self.runs[ident]

    def ended(self, ident: int) -> list[str]:
        with self._lock:
            counts = {how: self.ends[how, ident] for how in ("finished", "failed", "cancelled")}
        return [how for how, n in counts.items() for _ in range(n)]


class StressClosure:
    def __init__(self, ident: int, ledger: Ledger, tag: int | None) -> None:
        self.ident = ident
        self.tag = tag
        self._ledger = ledger

    def mark_cancelled(self) -> None:
        self._ledger.record("cancelled", self.ident)


@pytest.mark.parametrize("seed,max_size", [(1, 16), (2, 0), (3, 262144)])
def test_every_closure_ends_exactly_once_under_concurrency(seed: int, max_size: int) -> None:
    q = ClosureQueue(max_size)
    ledger = Ledger()
    total = PRODUCERS * PER_PRODUCER
    producers_left = threading.Semaphore(0)
    raised: list[BaseException] = []
    unexpected: list[BaseException] = []
    raised_lock = threading.Lock()

    def note(exc: BaseException) -> None:
        with raised_lock:
            (raised if isinstance(exc, Failure) else unexpected).append(exc)

    def produce(p: int) -> None:
        rng = random.Random(seed * 1000 + p)
        try:
            for i in range(PER_PRODUCER):
                ident = p * PER_PRODUCER + i
                tag = rng.randrange(CONSUMERS) if rng.random() < 0.05 else None
                try:
                    q.put(StressClosure(ident, ledger, tag), tag=tag)
                except Failure as exc:  # queued, then cancelled with the rest
                    note(exc)
        except BaseException as exc:
            note(exc)
        finally:
            producers_left.release()

    def consume(c: int) -> None:
        rng = random.Random(seed * 2000 + c)
        try:
            while (closure := q.get(timeout=0.02, tag=c)) is not None or not stopped.is_set():
                if closure is None:
                    continue
                ledger.ran(closure.ident)
                if closure.tag is not None:
                    ledger.record("finished", closure.ident)  # tagged: never settled
                    continue
                roll = rng.random()
                if roll < 0.02:
                    ledger.record("failed", closure.ident)
                    q.mark_failed(Failure(f"closure {closure.ident} failed"))
                elif roll < 0.12:
                    q.put_back(closure)
                else:
                    ledger.record("finished", closure.ident)
                    q.mark_finished()
        except BaseException as exc:
            note(exc)

    def join(j: int) -> None:
        rng = random.Random(seed * 3000 + j)
        try:
            while not producing_done.is_set():
                try:
                    if rng.random() < 0.5:
                        q.wait(timeout=rng.random() * 0.005)
                    else:
                        q.done()
                except Failure as exc:
                    note(exc)
        except BaseException as exc:
            note(exc)

    stopped = threading.Event()
    producing_done = threading.Event()
    threads = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    threads += [threading.Thread(target=consume, args=(c,)) for c in range(CONSUMERS)]
    joiners = [threading.Thread(target=join, args=(j,)) for j in range(JOINERS)]
    for thread in threads + joiners:
        thread.daemon = True
        thread.start()
    for _ in range(PRODUCERS):
        assert producers_left.acquire(timeout=DEADLINE), "a producer is stuck"
    producing_done.set()
    for thread in joiners:
        thread.join(DEADLINE)
        assert not thread.is_alive(), "a joiner is stuck"

    # Drain: wait() until everything untagged finished, raising any late failures.
    while True:
        try:
            assert q.wait(timeout=DEADLINE), f"the queue did not drain: {q!r}"
            break
        except Failure as exc:
            note(exc)
    stopped.set()
    q.stop()  # cancels tagged closures their worker never took, releases consumers
    for thread in threads:
        thread.join(DEADLINE)
        assert not thread.is_alive(), f"{thread.name} is stuck"

    assert not unexpected, unexpected
    assert (len(q), q.inflight) == (0, 0)
    for ident in range(total):
        assert len(ledger.ended(ident)) == 1, (ident, ledger.ended(ident))
    ends = Counter(how for (how, _), n in ledger.ends.items() for _ in range(n))
    assert sum(ends.values()) == total
    if ends["failed"]:
        assert raised, "failures happened but none was ever raised"
