"""The shared tokio runtime under threads and fork, against a real worker."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cloudpickle
import pytest

from jaxcluster import wire
from jaxcluster._native import core
from support.workers import WorkerProc, running_worker

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProc]:
    with running_worker(["--index", "0"]) as w:
        yield w


def timed_square(n: int) -> tuple[int, float, float]:
    import time

    start = time.monotonic()
    total = sum(i * i for i in range(20_000))  # a little real work
    assert total > 0
    return n * n, start, time.monotonic()


def test_many_threads_share_one_client_and_closures_never_overlap(worker: WorkerProc) -> None:
    client = worker.client()
    payload = wire.function_payload(timed_square)
    client.register_function(payload.function_hash, payload.kind, payload.payload)

    def call(n: int) -> tuple[int, float, float]:
        args = wire.encode(((n,), {}))
        reply: dict[str, Any] = client.run_closure(payload.function_hash, args.pickle, closure_id=n)
        assert reply["closure_id"] == n
        return wire.decode(reply["value"], reply["buffers"])  # type: ignore[no-any-return]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(call, range(40)))
    assert [r[0] for r in results] == [n * n for n in range(40)]
    # The worker runs one closure at a time: its execution intervals are disjoint.
    intervals = sorted((start, end) for _, start, end in results)
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert end <= start


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_is_refused_the_parents_runtime(worker: WorkerProc) -> None:
    client = worker.client()
    client.get_status()  # the runtime now exists in this process
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report what happened through the pipe, then leave at once
        try:
            core.WorkerClient(worker.address)
            message = b"no error"
        except RuntimeError as exc:
            message = str(exc).encode()
        except BaseException as exc:
            message = f"unexpected {type(exc).__name__}: {exc}".encode()
        os.write(write_end, message)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    assert "a forked child cannot use it" in message, message
    assert f"created in process {os.getpid()}" in message
    assert client.get_status()["state"] == "serving"  # the parent is unaffected
