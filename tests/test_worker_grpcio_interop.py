"""A plain grpcio client, with stubs compiled from the proto at test time, talks to a worker."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from jaxcluster import wire
from jaxcluster.coordinator import functions
from support.grpc_stubs import worker_stubs
from support.workers import WorkerProc, running_worker

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_tools.protoc")

TOKEN = "interop-token"
INDEX = 6


@pytest.fixture(scope="module")
def stubs() -> tuple[ModuleType, ModuleType]:
    return worker_stubs()


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProc]:
    with running_worker(["--index", str(INDEX), "--max-message-bytes", "65536"], token=TOKEN) as w:
        yield w


@pytest.fixture
def stub(worker: WorkerProc, stubs: tuple[ModuleType, ModuleType]) -> Iterator[Any]:
    channel = grpc.insecure_channel(worker.address)
    try:
        yield stubs[1].WorkerStub(channel)
    finally:
        channel.close()


AUTH = (("authorization", f"Bearer {TOKEN}"),)


def test_get_status_and_list_devices(stub: Any, stubs: tuple[ModuleType, ModuleType]) -> None:
    pb2 = stubs[0]
    status = stub.GetStatus(pb2.GetStatusRequest(), metadata=AUTH, timeout=30)
    assert status.worker_index == INDEX
    assert status.state == pb2.SERVING_STATE_SERVING
    assert status.jax_version and status.platform == "cpu"
    assert status.protocol_revision >= 4
    devices = stub.ListDevices(pb2.ListDevicesRequest(), metadata=AUTH, timeout=30).devices
    assert len(devices) >= 1
    assert all(d.device_type == "CPU" for d in devices)
    assert devices[0].name.startswith(f"/job:worker/replica:0/task:{INDEX}/")
    assert devices[0].name.endswith("/device:CPU:0")


def _register(stub: Any, pb2: ModuleType, payload: Any) -> None:
    """Sends a cloudpickled function with the token, as the coordinator would."""
    stub.RegisterFunction(
        pb2.RegisterFunctionRequest(
            function_hash=payload.function_hash,
            kind=pb2.FUNCTION_KIND_CLOUDPICKLE,
            payload=payload.payload,
        ),
        metadata=AUTH,
        timeout=30,
    )


def test_a_closure_round_trips_through_grpcio(
    stub: Any, stubs: tuple[ModuleType, ModuleType]
) -> None:
    pb2 = stubs[0]
    payload = functions.pickle_function(lambda a: a[::-1] * 2)
    _register(stub, pb2, payload)
    args = wire.encode(((np.arange(5),), {}))
    reply = stub.RunClosure(
        pb2.RunClosureRequest(
            function_hash=payload.function_hash,
            args=pb2.Value(pickle=args.pickle, buffers=args.buffers),
            closure_id=77,
        ),
        metadata=AUTH,
        timeout=30,
    )
    assert reply.closure_id == 77 and reply.WhichOneof("outcome") == "result"
    result = wire.decode(reply.result.pickle, list(reply.result.buffers))
    np.testing.assert_array_equal(result, np.arange(5)[::-1] * 2)


def test_status_codes_reach_grpcio_clients(stub: Any, stubs: tuple[ModuleType, ModuleType]) -> None:
    pb2 = stubs[0]
    with pytest.raises(grpc.RpcError) as missing:
        stub.GetStatus(pb2.GetStatusRequest(), timeout=30)
    assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as unknown:
        stub.RunClosure(pb2.RunClosureRequest(function_hash=b"\0" * 32), metadata=AUTH, timeout=30)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as malformed:
        stub.RunClosure(pb2.RunClosureRequest(function_hash=b"\0" * 3), metadata=AUTH, timeout=30)
    assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    oversized = pb2.RunClosureRequest(
        function_hash=b"\0" * 32, args=pb2.Value(pickle=b"\x80\x05N.", buffers=[b"x" * 100_000])
    )
    with pytest.raises(grpc.RpcError) as too_big:
        stub.RunClosure(oversized, metadata=AUTH, timeout=30)
    assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Still serving after all of that.
    status = stub.GetStatus(pb2.GetStatusRequest(), metadata=AUTH, timeout=30)
    assert status.worker_index == INDEX


def _streamed_closure(pb2: ModuleType, function_hash: bytes, closure_id: int, n: int) -> Any:
    args = wire.encode(((n,), {}))
    return pb2.RunClosureRequest(
        function_hash=function_hash,
        args=pb2.Value(pickle=args.pickle, buffers=args.buffers),
        closure_id=closure_id,
    )


def test_closures_stream_through_grpcio(stub: Any, stubs: tuple[ModuleType, ModuleType]) -> None:
    pb2 = stubs[0]
    payload = functions.pickle_function(lambda n: n * 10)
    _register(stub, pb2, payload)
    requests = [
        pb2.RunClosuresRequest(
            closures=[_streamed_closure(pb2, payload.function_hash, i, i) for i in range(3)]
        ),
        pb2.RunClosuresRequest(
            closures=[_streamed_closure(pb2, payload.function_hash, i, i) for i in range(3, 5)]
        ),
    ]
    # The request iterator ends (a half-close): the worker still answers everything sent.
    replies = [
        reply
        for response in stub.RunClosures(iter(requests), metadata=AUTH, timeout=60)
        for reply in response.replies
    ]
    assert [r.closure_id for r in replies] == [0, 1, 2, 3, 4]
    assert all(r.WhichOneof("outcome") == "result" for r in replies)
    assert [wire.decode(r.result.pickle, list(r.result.buffers)) for r in replies] == [
        0,
        10,
        20,
        30,
        40,
    ]


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer not-the-token"),)])
def test_a_stream_without_the_token_is_unauthenticated_and_runs_nothing(
    stub: Any, stubs: tuple[ModuleType, ModuleType], metadata: tuple[tuple[str, str], ...]
) -> None:
    pb2 = stubs[0]
    payload = functions.pickle_function(lambda n: n + 1)
    _register(stub, pb2, payload)
    before = stub.GetStatus(pb2.GetStatusRequest(), metadata=AUTH, timeout=30)
    request = pb2.RunClosuresRequest(closures=[_streamed_closure(pb2, payload.function_hash, 1, 1)])
    with pytest.raises(grpc.RpcError) as refused:
        list(stub.RunClosures(iter([request]), metadata=metadata, timeout=30))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    after = stub.GetStatus(pb2.GetStatusRequest(), metadata=AUTH, timeout=30)
    assert after.closures_run == before.closures_run, "nothing ran"
    assert after.unauthenticated_requests == before.unauthenticated_requests + 1
