"""Values above the message limit travel in chunks (protocol revision 4): worker closures on
the RunClosures stream and the unary calls, chunk boundaries, refused malformed sequences.

Most tests run a worker and a client with a 64 KiB message limit, so every boundary (a
value that fits one message, one byte more, many chunks, many buffers) costs kilobytes.
The 1 GiB round trip at the default limit is the real-size check.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from jaxcluster import wire
from jaxcluster._native import core
from jaxcluster.coordinator import functions
from support.closures import TESTS_DIR, local_cluster
from support.grpc_stubs import worker_stubs
from support.workers import WorkerProc, running_worker

LIMIT = 64 * 1024
TOKEN = "chunk-token"


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProc]:
    path = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)
    args = ["--max-message-bytes", str(LIMIT)]
    with running_worker(args, token=TOKEN, env={"PYTHONPATH": path}) as w:
        yield w


def identity(x: Any) -> Any:
    return x


def checksum(*arrays: np.ndarray) -> list[int]:
    return [int(a.view(np.uint8).astype(np.uint64).sum()) for a in arrays]


def make(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, n, dtype=np.uint8)


def _registered(register: Any, fn: Any) -> bytes:
    payload = functions.pickle_function(fn)
    register(payload.function_hash, payload.kind, payload.payload)
    return payload.function_hash


def _dispatch(worker: WorkerProc) -> Any:
    return core.Dispatcher([worker.address], auth_token=TOKEN, max_message_bytes=LIMIT)


def _run(dispatcher: Any, fn_hash: bytes, *args: Any) -> Any:
    encoded = wire.encode((args, {}), zero_copy=True)
    cell = dispatcher.schedule(fn_hash, encoded.pickle, encoded.buffers, [])
    assert cell.wait(timeout=120)
    result = cell.result()
    assert isinstance(result, core.EncodedValue), result
    return wire.decode(result.pickle, result.buffers)


# Sizes around one message: the pickle and framing add ~200 bytes to an array's bytes.
BOUNDARY_SIZES = [LIMIT - 400, LIMIT - 200, LIMIT, LIMIT + 1, 3 * LIMIT + 17, 40 * LIMIT]


def test_stream_round_trips_at_every_chunk_boundary(worker: WorkerProc) -> None:
    dispatcher = _dispatch(worker)
    try:
        fn_hash = _registered(dispatcher.register_function, identity)
        for size in BOUNDARY_SIZES:
            x = make(size, size)
            back = _run(dispatcher, fn_hash, x)
            np.testing.assert_array_equal(back, x, err_msg=f"size {size}")
        # Many buffers in one value, together far above one message.
        arrays = [make(9000 + i, i) for i in range(60)]
        back = _run(dispatcher, fn_hash, arrays)
        assert len(back) == 60
        for a, b in zip(arrays, back, strict=True):
            np.testing.assert_array_equal(a, b)
        status = worker.client(TOKEN).get_status()
        assert status["protocol_revision"] >= 4
        assert status["closures_run"] >= len(BOUNDARY_SIZES) + 1
    finally:
        dispatcher.shutdown()


def test_byte_counters_count_a_chunked_value_once(worker: WorkerProc) -> None:
    dispatcher = _dispatch(worker)
    client = worker.client(TOKEN)
    try:
        fn_hash = _registered(dispatcher.register_function, identity)
        _run(dispatcher, fn_hash, make(16, 0))  # stream open, function registered
        before = client.get_status()
        x = make(10 * LIMIT + 5, 3)  # eleven chunks each way
        np.testing.assert_array_equal(_run(dispatcher, fn_hash, x), x)
        after = client.get_status()
        for key in ("closure_bytes_received", "closure_bytes_sent"):
            moved = after[key] - before[key]
            # The array plus its pickle (a few hundred bytes): counted once, not per chunk
            # and not with the chunks' framing.
            assert x.nbytes <= moved < x.nbytes + 1024, (key, moved, x.nbytes)
    finally:
        dispatcher.shutdown()


def test_unary_calls_take_and_give_large_values_in_chunks(worker: WorkerProc) -> None:
    client = worker.client(TOKEN, max_message_bytes=LIMIT)
    payload = functions.pickle_function(checksum)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    for size in (LIMIT + 1, 5 * LIMIT):
        x = make(size, 7)
        encoded = wire.encode(((x, x[::-1].copy()), {}))
        reply = client.run_closure(payload.function_hash, encoded.pickle, encoded.buffers)
        assert reply["error"] is None, reply["error"]
        assert wire.decode(reply["value"], reply["buffers"]) == checksum(x, x[::-1])
    # A resource created from arguments above the limit.
    stored = functions.pickle_function(identity)
    client.register_function(stored.function_hash, stored.kind, stored.payload)
    args = wire.encode(((make(3 * LIMIT, 1),), {}))
    created = client.create_resource(7, stored.function_hash, args.pickle, args.buffers)
    assert created == {"resource_id": 7, "reattached": False, "error": None}
    assert client.release_resource([7]) == 1


def test_a_large_result_of_a_unary_call_is_refused_with_the_sizes(worker: WorkerProc) -> None:
    # Unary RunClosure cannot know the answer's size before asking: a result above the
    # limit is refused (the RunClosures stream, which the coordinator uses, chunks it).
    client = worker.client(TOKEN, max_message_bytes=LIMIT)
    payload = functions.pickle_function(make)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    encoded = wire.encode(((4 * LIMIT, 3), {}))
    from jaxcluster.errors import ResourceExhaustedError

    with pytest.raises(ResourceExhaustedError, match="bytes"):
        client.run_closure(payload.function_hash, encoded.pickle, encoded.buffers)


# --- malformed chunk sequences, from a grpcio client ----------------------------------------


@pytest.fixture(scope="module")
def stubs() -> tuple[ModuleType, ModuleType]:
    pytest.importorskip("grpc_tools.protoc")
    return worker_stubs()


AUTH = (("authorization", f"Bearer {TOKEN}"),)


def _malformed_sequences(pb2: ModuleType) -> list[tuple[str, list[Any], str]]:
    chunk = pb2.Chunk
    return [
        ("more data than announced", [chunk(total_bytes=4, data=b"abcdef")], "INVALID_ARGUMENT"),
        ("a continuation first", [chunk(data=b"abc")], "INVALID_ARGUMENT"),
        (
            "a new sequence inside one",
            [chunk(total_bytes=8, data=b"abc"), chunk(total_bytes=3, data=b"abc")],
            "INVALID_ARGUMENT",
        ),
        (
            "bytes that do not decode",
            [chunk(total_bytes=3, data=b"\xff\xff\xff")],
            "INVALID_ARGUMENT",
        ),
        ("an absurd size", [chunk(total_bytes=1 << 40, data=b"x")], "RESOURCE_EXHAUSTED"),
    ]


def test_malformed_chunk_sequences_are_refused_and_the_worker_keeps_serving(
    worker: WorkerProc, stubs: tuple[ModuleType, ModuleType]
) -> None:
    grpc = pytest.importorskip("grpc")
    pb2, pb2_grpc = stubs
    rejected_before = worker.client(TOKEN).get_status()["rejected_requests"]
    with grpc.insecure_channel(worker.address) as channel:
        stub = pb2_grpc.WorkerStub(channel)
        for what, chunks, code in _malformed_sequences(pb2):
            messages = [pb2.RunClosuresRequest(chunk=c) for c in chunks]
            with pytest.raises(grpc.RpcError) as stream_error:
                list(stub.RunClosures(iter(messages), metadata=AUTH, timeout=60))
            assert stream_error.value.code().name == code, (what, stream_error.value.details())
            with pytest.raises(grpc.RpcError) as call_error:
                chunks[0].method = "RunClosure"
                list(stub.CallChunked(iter(chunks), metadata=AUTH, timeout=60))
            assert call_error.value.code().name == code, (what, call_error.value.details())
        with pytest.raises(grpc.RpcError) as unknown:
            request = pb2.Chunk(total_bytes=0, method="Nope")
            list(stub.CallChunked(iter([request]), metadata=AUTH, timeout=60))
        assert unknown.value.code().name == "UNIMPLEMENTED"
        assert "Nope" in (unknown.value.details() or "")
        # Still serving, small messages from grpcio as before.
        status = stub.GetStatus(pb2.GetStatusRequest(), metadata=AUTH, timeout=30)
        assert status.protocol_revision >= 4
        assert status.rejected_requests >= rejected_before + 2 * len(_malformed_sequences(pb2))
    dispatcher = _dispatch(worker)
    try:
        fn_hash = _registered(dispatcher.register_function, identity)
        x = make(3 * LIMIT, 5)
        np.testing.assert_array_equal(_run(dispatcher, fn_hash, x), x)
    finally:
        dispatcher.shutdown()


# --- real size ---------------------------------------------------------------------------------


def head_and_sum(a: np.ndarray) -> tuple[int, np.ndarray, int]:
    return a.nbytes, a[::65537].copy(), int(a[-1])


@pytest.mark.timeout(600)
def test_a_1_gib_argument_and_result_round_trip_through_the_coordinator() -> None:
    n = (1 << 30) // 4
    x = np.arange(n, dtype=np.uint32)
    with local_cluster(1) as cluster, cluster.coordinator() as coordinator:
        nbytes, sample, last = coordinator.schedule(head_and_sum, args=(x,)).fetch()
        assert nbytes == 1 << 30 and last == n - 1
        np.testing.assert_array_equal(sample, x[::65537])
        back = coordinator.schedule(identity, args=(x,)).fetch()
        assert back.dtype == np.uint32 and back.shape == x.shape
        assert int(back[-1]) == n - 1
        np.testing.assert_array_equal(back[::4099], x[::4099])
        assert not back.flags.writeable  # a view of the received bytes, not a copy


def ones(n: int) -> Any:
    """Runs on a worker: ``n`` bytes of ones, made there (nothing large is sent to it)."""
    return np.ones(n, dtype=np.uint8)


def test_a_large_chunked_result_counts_as_a_sign_of_life_not_a_silence() -> None:
    # 768 MiB arrive in twelve 64 MiB chunks over a few seconds; the worker sends no
    # heartbeat meanwhile (its stream is busy with the chunks), so a coordinator that only
    # counted whole messages declared it silent after heartbeat_timeout and ran the closure
    # again, until WorkerCrashedError.
    with (
        local_cluster(1) as cluster,
        cluster.coordinator(heartbeat_timeout=1.0) as coordinator,
    ):
        value = coordinator.schedule(ones, args=(768 << 20,)).fetch()
        assert value.nbytes == 768 << 20 and int(value[-1]) == 1
        metrics = coordinator.metrics()
        assert (metrics["retried"], metrics["worker_failures"]) == (0, 0)


def test_large_chunked_values_keep_their_worker_alive_both_ways() -> None:
    # While a large argument is on its way, the pings sent after it wait behind its chunks;
    # while a large result is encoded, nothing leaves the worker. Both took longer than a
    # short heartbeat_timeout: the worker was declared silent and the closure sent again
    # (with two workers, back and forth for ever). Now the worker sends a heartbeat as an
    # argument's chunks arrive, and no side encodes a whole chunked message first (chunks
    # are slices of the array), so the only silences are the network's.
    x = np.ones(768 << 20, dtype=np.uint8)
    with (
        local_cluster(2) as cluster,
        cluster.coordinator(heartbeat_timeout=0.5) as coordinator,
    ):
        back = coordinator.schedule(identity, args=(x,)).fetch(timeout=120)
        assert back.nbytes == x.nbytes and int(back[-1]) == 1
        metrics = coordinator.metrics()
        assert (metrics["retried"], metrics["worker_failures"]) == (0, 0)
