"""The shared tokio runtime under threads and fork, against a real worker."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cloudpickle
import pytest

from jaxcluster import wire
from jaxcluster.coordinator import functions
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
    payload = functions.pickle_function(timed_square)
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


# Run in a fresh interpreter: pytest's process has JAX's threads, which fork() does not
# mix with; the point here is only what jaxcluster does in the child.
FORK_SCRIPT = """
import os, sys
from jaxcluster._native import core
from jaxcluster.coordinator import functions
client = core.WorkerClient(sys.argv[1], auth_token=sys.argv[2])
client.get_status()  # the runtime now exists in this process
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        core.WorkerClient(sys.argv[1])
        message = "no error"
    except RuntimeError as exc:
        message = str(exc)
    except BaseException as exc:
        message = f"unexpected {type(exc).__name__}: {exc}"
    os.write(write_end, message.encode())
    os._exit(0)
os.close(write_end)
with os.fdopen(read_end, "rb") as pipe:
    print(pipe.read().decode())
os.waitpid(pid, 0)
print("parent", os.getpid(), client.get_status()["state"])
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_is_refused_the_parents_runtime(worker: WorkerProc) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, worker.address, worker.token or ""],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    child_message, parent_line = done.stdout.strip().rsplit("\n", 1)
    _, parent_pid, state = parent_line.split()
    assert "a forked child cannot use it" in child_message, child_message
    assert f"created in process {parent_pid}" in child_message
    assert state == "serving"  # the parent's client still works after the fork
