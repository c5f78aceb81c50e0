"""PsClient against real `python -m jaxcluster.ps` processes on 127.0.0.1: dtypes and shapes,
atomic concurrent updates from threads and processes, scatter_add, auth, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from jaxcluster._local_tasks import TaskProcess
from jaxcluster._native import core
from jaxcluster.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnauthenticatedError,
)

TOKEN = "ps-client-test-token"
DTYPES = [
    np.float16,
    ml_dtypes.bfloat16,
    np.float32,
    np.float64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
]


@pytest.fixture(scope="module")
def ps_addresses() -> Iterator[list[str]]:
    env = {**os.environ, "JAXCLUSTER_AUTH_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    processes = [TaskProcess("ps", i, "127.0.0.1:0", env) for i in range(2)]
    try:
        deadline = time.monotonic() + 120
        yield [p.wait_listening(deadline) for p in processes]
    finally:
        for p in processes:
            p.kill()


def client(address: str, token: str | None = TOKEN) -> Any:
    return core.PsClient(address, auth_token=token, timeout=30.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (3,), (2, 0), (2, 3, 4)], ids=str)
def test_values_keep_dtype_shape_and_content(
    ps_addresses: list[str], dtype: Any, shape: tuple[int, ...]
) -> None:
    c = client(ps_addresses[0])
    name = f"rt/{np.dtype(dtype).name}/{shape}"
    initial = (np.arange(int(np.prod(shape))) % 50).astype(dtype).reshape(shape)
    c.create_variable(name, initial, replace=True)
    read = c.read(name)
    assert read.dtype == np.dtype(dtype) and read.shape == shape
    np.testing.assert_array_equal(read, initial)
    read[...] = 0  # a writable copy, not a view of anything shared
    ones = np.ones(shape, dtype)
    after = c.assign_add(name, ones, read_value=True)
    np.testing.assert_array_equal(after, (initial + ones).astype(dtype))
    version = c.assign_sub(name, ones)
    assert version == 2
    np.testing.assert_array_equal(c.read(name), initial)


def test_big_endian_and_non_contiguous_inputs_are_converted(ps_addresses: list[str]) -> None:
    c = client(ps_addresses[1])
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    c.create_variable("be", big_endian, replace=True)
    np.testing.assert_array_equal(c.read("be"), np.arange(6).reshape(2, 3))
    assert c.read("be").dtype == np.dtype("int32")
    strided = np.arange(12, dtype=np.int32).reshape(2, 6)[:, ::2]
    c.assign("be", strided)
    np.testing.assert_array_equal(c.read("be"), [[0, 2, 4], [6, 8, 10]])


def test_concurrent_assign_add_from_threads_and_processes_loses_nothing(
    ps_addresses: list[str],
) -> None:
    threads, per_thread, procs, per_proc = 8, 200, 3, 200
    for address in ps_addresses:
        client(address).create_variable("counter", np.zeros((4,), np.int64), replace=True)
    shared = [client(a) for a in ps_addresses]

    def hammer() -> None:
        for _ in range(per_thread):
            for c in shared:
                c.assign_add("counter", np.ones((4,), np.int64))

    script = textwrap.dedent(
        f"""
        import numpy as np
        from jaxcluster._native import core
        clients = [core.PsClient(a, auth_token={TOKEN!r}) for a in {ps_addresses!r}]
        for _ in range({per_proc}):
            for c in clients:
                c.assign_add("counter", np.ones((4,), np.int64))
        """
    )
    children = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(procs)]
    workers = [threading.Thread(target=hammer) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert [child.wait(timeout=240) for child in children] == [0] * procs
    expected = threads * per_thread + procs * per_proc
    for c in shared:
        value, version = c.read_versioned("counter")
        np.testing.assert_array_equal(value, [expected] * 4)
        assert version == expected


def test_scatter_add_adds_rows_and_repeats_accumulate(ps_addresses: list[str]) -> None:
    c = client(ps_addresses[0])
    c.create_variable("table", np.zeros((4, 2), np.float32), replace=True)
    updates = np.array([[1, 2], [10, 20], [100, 200]], np.float32)
    after = c.scatter_add("table", np.array([3, 0, 3]), updates, read_value=True)
    np.testing.assert_array_equal(after, [[10, 20], [0, 0], [0, 0], [101, 202]])
    assert c.scatter_add("table", 1, np.array([[5, 5]], np.float32)) == 2
    assert c.scatter_add("table", [], np.zeros((0, 2), np.float32)) == 3
    with pytest.raises(InvalidArgumentError, match=r"indices\[1\] = 4 is out of range"):
        c.scatter_add("table", [0, 4], np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="integer"):
        c.scatter_add("table", [0.5], np.ones((1, 2), np.float32))
    np.testing.assert_array_equal(c.read("table")[1], [5, 5])


def test_missing_or_wrong_token_is_refused(ps_addresses: list[str]) -> None:
    client(ps_addresses[0]).create_variable("secret", np.float32(42), replace=True)
    for token in (None, "wrong-token"):
        c = client(ps_addresses[0], token)
        with pytest.raises(UnauthenticatedError, match="ps"):
            c.read("secret")
        with pytest.raises(UnauthenticatedError):
            c.assign("secret", np.float32(0))
    assert client(ps_addresses[0]).read("secret") == np.float32(42)


def test_bad_input_is_explained_and_the_ps_keeps_serving(ps_addresses: list[str]) -> None:
    c = client(ps_addresses[1])
    c.create_variable("w", np.zeros((2, 3), np.float32), replace=True)
    before = c.get_status()["rejected_requests"]
    with pytest.raises(InvalidArgumentError) as info:
        c.assign_add("w", np.zeros((2, 3), np.float64))
    message = str(info.value)
    assert "'w'" in message or '"w"' in message
    assert "float32[2, 3]" in message and "float64[2, 3]" in message
    with pytest.raises(InvalidArgumentError, match=r"float32\[3, 2\].*shape \[2, 3\]"):
        c.assign("w", np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="complex128"):
        c.assign("w", np.zeros((2, 3), np.complex128))
    with pytest.raises(NotFoundError, match="no variable named"):
        c.read("never-created")
    with pytest.raises(FailedPreconditionError, match="already exists"):
        c.create_variable("w", np.float32(1))
    with pytest.raises(ValueError, match="empty"):
        c.read("")
    status = c.get_status()
    assert status["rejected_requests"] == before + 4
    np.testing.assert_array_equal(c.read("w"), np.zeros((2, 3), np.float32))


def test_many_list_and_delete(ps_addresses: list[str]) -> None:
    c = client(ps_addresses[0])
    c.create_variable("m/a", np.float32(1), replace=True)
    c.create_variable("m/b", np.arange(3, dtype=np.int32), replace=True)
    with pytest.raises(InvalidArgumentError):
        c.assign_many([("m/a", np.float32(5)), ("m/b", np.zeros(4, np.int32))])
    assert c.read("m/a") == 1, "a rejected assign_many changes nothing"
    assert c.assign_many([("m/a", np.float32(5)), ("m/c", np.int8(3))], create_missing=True) == (
        1,
        1,
    )
    values = c.read_many(["m/c", "m/a"])
    assert list(values) == ["m/c", "m/a"]
    assert values["m/c"].dtype == np.int8 and values["m/a"] == 5
    listed = {v["name"]: v for v in c.list_variables()}
    assert listed["m/b"]["dtype"] == "int32" and listed["m/b"]["shape"] == (3,)
    assert c.delete_variables(["m/a", "m/b", "m/c", "m/zzz"]) == 3
    assert "m/a" not in {v["name"] for v in c.list_variables()}
