"""RegisterFunction / RunClosure / resources against a real worker process."""

from __future__ import annotations

import pickle
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jaxcluster import wire
from jaxcluster.coordinator import functions
from jaxcluster.coordinator._errors import rebuild_exception
from jaxcluster.errors import NotFoundError
from jaxcluster.worker import get_current_worker_index
from support.workers import WorkerProc, running_worker

WORKER_INDEX = 4


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProc]:
    with running_worker(["--index", str(WORKER_INDEX)]) as w:
        yield w


def register(client: Any, fn: Any) -> bytes:
    payload = functions.pickle_function(fn)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    return payload.function_hash


def run(client: Any, fn_hash: bytes, *args: Any, **kwargs: Any) -> dict[str, Any]:
    encoded = wire.encode((args, kwargs))
    return client.run_closure(fn_hash, encoded.pickle, encoded.buffers, closure_id=11)


def value_of(reply: dict[str, Any]) -> Any:
    assert reply["error"] is None, reply["error"]
    return wire.decode(reply["value"], reply["buffers"])


def test_a_cloudpickled_function_runs_on_numpy_arguments(worker: WorkerProc) -> None:
    client = worker.client()
    offset = 0.5  # captured by the closure: cloudpickle must carry it

    def affine(x: np.ndarray, w: np.ndarray, *, scale: float) -> dict[str, Any]:
        return {"y": (x @ w) * scale + offset, "index": get_current_worker_index()}

    x = np.random.default_rng(0).normal(size=(64, 32))
    w = np.random.default_rng(1).normal(size=(32, 8))
    reply = run(client, register(client, affine), x, w, scale=2.0)
    assert reply["closure_id"] == 11
    result = value_of(reply)
    np.testing.assert_allclose(result["y"], (x @ w) * 2.0 + offset)
    assert result["index"] == WORKER_INDEX
    # The result array came back as an out-of-band buffer, not inside the pickle.
    assert [len(b) for b in reply["buffers"]] == [64 * 8 * 8]


def test_registration_is_idempotent_and_counted(worker: WorkerProc) -> None:
    client = worker.client()

    def triple(v: int) -> int:
        return 3 * v

    payload = functions.pickle_function(triple)
    before = client.get_status()["functions_registered"]
    assert client.register_function(payload.function_hash, payload.kind, payload.payload) is False
    assert client.register_function(payload.function_hash, payload.kind, payload.payload) is True
    assert client.get_status()["functions_registered"] == before + 1
    assert value_of(run(client, payload.function_hash, 5)) == 15


def test_a_user_exception_comes_back_structured(worker: WorkerProc) -> None:
    client = worker.client()

    class CustomError(Exception):
        """Local, so cloudpickle sends it by value; it comes back as this very class."""

    def fails(n: int) -> None:
        raise CustomError(f"bad input {n}")

    status_before = client.get_status()
    error = run(client, register(client, fails), 7)["error"]
    assert error["kind"] == "user"
    assert error["type_name"].endswith("CustomError")
    assert error["module"] == __name__
    assert error["message"] == "bad input 7"
    assert "in fails" in error["traceback"]
    assert 'raise CustomError(f"bad input {n}")' in error["traceback"]
    assert "executor.py" not in error["traceback"]
    rebuilt = rebuild_exception(error)
    assert type(rebuilt) is CustomError and str(rebuilt) == "bad input 7"
    status = client.get_status()
    assert status["closures_failed"] == status_before["closures_failed"] + 1


def test_an_exception_that_cannot_be_pickled_still_reports_what_happened(
    worker: WorkerProc,
) -> None:
    client = worker.client()

    class HoldsALock(Exception):
        def __init__(self) -> None:
            super().__init__("lock holder failed")
            self.lock = threading.Lock()

    def fails() -> None:
        raise HoldsALock()

    error = run(client, register(client, fails))["error"]
    assert error["kind"] == "user"
    assert error["exception"] is None
    assert error["type_name"].endswith("HoldsALock")
    assert error["message"] == "lock holder failed"
    assert "raise HoldsALock()" in error["traceback"]


def test_a_result_that_cannot_be_pickled_is_a_user_error(worker: WorkerProc) -> None:
    client = worker.client()

    def returns_a_lock() -> Any:
        return threading.Lock()

    error = run(client, register(client, returns_a_lock))["error"]
    assert error["kind"] == "user"
    assert "lock" in error["message"]


def test_a_function_that_cannot_be_deserialized_is_a_function_load_error(
    worker: WorkerProc, tmp_path: Path
) -> None:
    # A function pickled by reference to a module the worker cannot import.
    module = tmp_path / "only_on_the_coordinator.py"
    module.write_text("def helper(x):\n    return x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import only_on_the_coordinator

        payload = pickle.dumps(only_on_the_coordinator.helper, protocol=5)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("only_on_the_coordinator", None)
    client = worker.client()
    fn_hash = wire.content_hash(payload)
    client.register_function(fn_hash, "cloudpickle", payload)
    error = run(client, fn_hash, 1)["error"]
    assert error["kind"] == "function_load"
    assert "could not be unpickled" in error["message"]
    assert "only_on_the_coordinator" in error["message"]
    assert "ModuleNotFoundError" in error["message"]

    not_callable = pickle.dumps({"a": 1}, protocol=5)
    client.register_function(wire.content_hash(not_callable), "cloudpickle", not_callable)
    error = run(client, wire.content_hash(not_callable))["error"]
    assert error["kind"] == "function_load"
    assert "not callable" in error["message"] and "dict" in error["message"]


def test_resources_are_created_used_and_released(worker: WorkerProc) -> None:
    client = worker.client()

    def make_iterator() -> Iterator[int]:
        return iter(range(get_current_worker_index() * 100, 10**6))

    def take(it: Iterator[int], n: int) -> list[int]:
        return [next(it) for _ in range(n)]

    make, take_hash = register(client, make_iterator), register(client, take)
    created = client.create_resource(501, make)
    assert created == {"resource_id": 501, "reattached": False, "error": None}
    ref = wire.ResourceRef(501)
    assert value_of(run(client, take_hash, ref, 2)) == [400, 401]
    assert value_of(run(client, take_hash, ref, 1)) == [402]  # the iterator kept its place

    assert client.release_resource([501, 999]) == 1
    error = run(client, take_hash, ref, 1)["error"]
    assert error["kind"] == "input" and error["resource_id"] == 501
    assert isinstance(rebuild_exception(error), NotFoundError)
    assert "holds no resource 501" in error["message"]


def test_a_failed_resource_fails_its_users_with_the_original_error(worker: WorkerProc) -> None:
    client = worker.client()

    def broken_dataset() -> None:
        raise ValueError("dataset_fn exploded")

    def use(it: Any) -> Any:
        return it

    created = client.create_resource(502, register(client, broken_dataset))
    assert created["error"]["kind"] == "user"
    assert created["error"]["message"] == "dataset_fn exploded"
    error = run(client, register(client, use), wire.ResourceRef(502))["error"]
    assert error["kind"] == "input" and error["resource_id"] == 502
    original = rebuild_exception(error)
    assert isinstance(original, ValueError) and str(original) == "dataset_fn exploded"


def test_get_current_worker_index_outside_a_closure_raises() -> None:
    with pytest.raises(RuntimeError, match="outside a closure running on a worker"):
        get_current_worker_index()
