"""Malformed, unknown and oversized requests get precise codes; the worker keeps serving."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest

from jaxcluster import wire
from jaxcluster.coordinator import functions
from jaxcluster.errors import InvalidArgumentError, NotFoundError, ResourceExhaustedError
from support.workers import WorkerProc, running_worker

LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProc]:
    with running_worker(["--max-message-bytes", str(LIMIT)]) as w:
        yield w


def identity(x: Any) -> Any:
    return x


# Functions of this test module must travel by value: the worker cannot import it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def still_serving(client: Any) -> None:
    """A real closure still runs after the bad request."""
    payload = functions.pickle_function(identity)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    encoded = wire.encode(((np.arange(4),), {}))
    reply = client.run_closure(payload.function_hash, encoded.pickle, encoded.buffers)
    np.testing.assert_array_equal(wire.decode(reply["value"], reply["buffers"]), np.arange(4))


def test_a_garbage_payload_is_invalid_argument(worker: WorkerProc) -> None:
    client = worker.client()
    garbage = b"this is not a pickle at all"
    with pytest.raises(InvalidArgumentError, match="not a pickle stream"):
        client.register_function(wire.content_hash(garbage), "cloudpickle", garbage)
    with pytest.raises(InvalidArgumentError, match=r"not a serialized jax\.export"):
        client.register_function(wire.content_hash(garbage), "jax_export", garbage)
    truncated = pickle.dumps(identity)[:-1]
    with pytest.raises(InvalidArgumentError, match="not a pickle stream"):
        client.register_function(wire.content_hash(truncated), "cloudpickle", truncated)
    still_serving(client)


@pytest.mark.parametrize("length", [0, 16, 31, 33, 64])
def test_a_malformed_hash_is_invalid_argument_before_any_lookup(
    worker: WorkerProc, length: int
) -> None:
    client = worker.client()
    bad_hash = b"\x01" * length
    with pytest.raises(InvalidArgumentError, match=f"function_hash is {length} bytes"):
        client.run_closure(bad_hash)
    with pytest.raises(InvalidArgumentError, match=f"function_hash is {length} bytes"):
        client.create_resource(1, bad_hash)
    payload = pickle.dumps(identity)
    with pytest.raises(InvalidArgumentError, match="32-byte SHA-256"):
        client.register_function(bad_hash, "cloudpickle", payload)
    still_serving(client)


def test_a_hash_that_does_not_match_the_payload_is_refused(worker: WorkerProc) -> None:
    client = worker.client()
    payload = functions.pickle_function(identity)
    wrong = wire.content_hash(b"something else")
    with pytest.raises(InvalidArgumentError, match="does not match the payload"):
        client.register_function(wrong, payload.kind, payload.payload)


def test_an_unknown_well_formed_hash_is_not_found(worker: WorkerProc) -> None:
    client = worker.client()
    unknown = wire.content_hash(b"never registered")
    with pytest.raises(NotFoundError, match=unknown.hex()):
        client.run_closure(unknown)
    with pytest.raises(NotFoundError, match="RegisterFunction"):
        client.create_resource(3, unknown)
    still_serving(client)


def test_malformed_arguments_are_invalid_argument(worker: WorkerProc) -> None:
    client = worker.client()
    payload = functions.pickle_function(identity)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    with pytest.raises(InvalidArgumentError, match="args is not a pickle stream"):
        client.run_closure(payload.function_hash, b"garbage args")
    not_a_pair = pickle.dumps([1, 2, 3], protocol=5)
    with pytest.raises(InvalidArgumentError, match=r"expected a tuple \(args, kwargs\)"):
        client.run_closure(payload.function_hash, not_a_pair)
    still_serving(client)


def test_an_oversized_request_is_resource_exhausted_and_the_worker_keeps_serving(
    worker: WorkerProc,
) -> None:
    client = worker.client()
    payload = functions.pickle_function(identity)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    big = wire.encode(((np.zeros(LIMIT, dtype=np.uint8),), {}))
    before = client.get_status()["closures_run"]
    with pytest.raises(ResourceExhaustedError, match="size limit"):
        client.run_closure(payload.function_hash, big.pickle, big.buffers)
    assert client.get_status()["closures_run"] == before  # it never reached the executor
    still_serving(client)


def test_an_oversized_result_is_resource_exhausted(worker: WorkerProc) -> None:
    client = worker.client()

    def make_big() -> np.ndarray:
        return np.zeros(LIMIT * 2, dtype=np.uint8)

    payload = functions.pickle_function(make_big)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    with pytest.raises(ResourceExhaustedError, match="result"):
        client.run_closure(payload.function_hash)
    still_serving(client)


def test_rejections_are_counted(worker: WorkerProc) -> None:
    client = worker.client()
    before = client.get_status()["rejected_requests"]
    with pytest.raises(InvalidArgumentError):
        client.run_closure(b"short")
    assert client.get_status()["rejected_requests"] == before + 1


def test_an_absurdly_long_timeout_waits_as_long_as_any_wait_without_a_panic(
    worker: WorkerProc,
) -> None:
    """A finite timeout past what a clock or gRPC's header holds (1e12 s, 1e30 s, 1e300 s)
    is taken as the longest wait (about 3,170 years); before, converting it to a deadline
    panicked (pyo3's PanicException, not even an Exception)."""
    client = worker.client()
    for long in (1e12, 1e30, 1e300):
        assert client.get_status(timeout=long)["state"] == "serving"
    with pytest.raises(ValueError, match="not a valid timeout"):
        client.get_status(timeout=float("nan"))
    still_serving(client)
