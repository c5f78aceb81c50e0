"""The baseline for ``ps_bench.py``: a parameter server written in pure Python on grpcio.

It serves the same ``jaxcluster.v1.ParameterServer`` protocol (``protos/.../ps.proto``,
compiled at run time with grpcio-tools) the way one would without a native core: a grpcio
thread-pool server, one ``threading.Lock`` per variable, numpy arithmetic on the received
bytes. Only what the benchmark uses is implemented (GetStatus, CreateVariable, Read,
AssignAdd); the client side is grpcio's generated stub.

Run it alone with ``python benches/ps_grpc_baseline.py --address 127.0.0.1:0``; it prints
``baseline ps listening on HOST:PORT`` and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import tempfile
import threading
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import numpy as np

PROTOS = Path(__file__).resolve().parents[1] / "protos"
_DTYPES = {3: np.dtype("<f4"), 4: np.dtype("<f8"), 7: np.dtype("<i4"), 8: np.dtype("<i8")}


def load_protocol() -> tuple[ModuleType, ModuleType]:
    """Compiles ps.proto with grpcio-tools into a temporary directory; returns the
    ``(messages, services)`` modules."""
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="jaxcluster-ps-baseline-")
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        "jaxcluster/v1/ps.proto",
        "jaxcluster/v1/worker.proto",  # ps.proto imports its `Chunk`
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpcio-tools could not compile {PROTOS / 'jaxcluster/v1/ps.proto'}")
    # The generated package is named `jaxcluster`, like the real one that wins the import;
    # load the two modules as top-level ones instead.
    generated = Path(out) / "jaxcluster" / "v1"
    for name in ("ps_pb2_grpc.py", "ps_pb2.py"):
        path = generated / name
        text = path.read_text().replace("from jaxcluster.v1 import ps_pb2", "import ps_pb2")
        path.write_text(text.replace("from jaxcluster.v1 import worker_pb2", "import worker_pb2"))
    sys.path.insert(0, str(generated))
    return importlib.import_module("ps_pb2"), importlib.import_module("ps_pb2_grpc")


def to_array(tensor: Any) -> np.ndarray:
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"the baseline handles dtype codes {sorted(_DTYPES)}, got {tensor.dtype}")
    return np.frombuffer(tensor.data, dtype=dtype).reshape(tuple(tensor.shape))


def to_tensor(pb: ModuleType, array: np.ndarray) -> Any:
    code = {v: k for k, v in _DTYPES.items()}[array.dtype.newbyteorder("<")]
    return pb.Tensor(dtype=code, shape=list(array.shape), data=array.tobytes())


def make_servicer(pb: ModuleType, services: ModuleType) -> Any:
    class Servicer(services.ParameterServerServicer):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            self._lock = threading.Lock()
            self._vars: dict[str, tuple[threading.Lock, np.ndarray, list[int]]] = {}

        def _get(self, name: str, context: Any) -> tuple[threading.Lock, np.ndarray, list[int]]:
            with self._lock:
                entry = self._vars.get(name)
            if entry is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no variable {name!r}")
            return entry  # type: ignore[return-value]

        def GetStatus(self, request: Any, context: Any) -> Any:
            with self._lock:
                return pb.PsStatusResponse(variables=len(self._vars))

        def CreateVariable(self, request: Any, context: Any) -> Any:
            value = to_array(request.initial_value).copy()
            with self._lock:
                replaced = request.name in self._vars
                self._vars[request.name] = (threading.Lock(), value, [0])
            return pb.CreateVariableResponse(replaced=replaced)

        def Read(self, request: Any, context: Any) -> Any:
            lock, value, version = self._get(request.name, context)
            with lock:
                return pb.ReadResponse(value=to_tensor(pb, value), version=version[0])

        def AssignAdd(self, request: Any, context: Any) -> Any:
            lock, value, version = self._get(request.name, context)
            delta = to_array(request.value)
            if delta.shape != value.shape or delta.dtype != value.dtype:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "dtype or shape mismatch")
            with lock:
                value += delta
                version[0] += 1
                return pb.UpdateResponse(version=version[0])

    return Servicer()


def serve(address: str) -> tuple[Any, str]:
    """Starts the baseline server; returns it and the bound ``host:port``."""
    pb, services = load_protocol()
    limit = 64 * 1024 * 1024
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ],
    )
    services.add_ParameterServerServicer_to_server(make_servicer(pb, services), server)
    host = address.rsplit(":", 1)[0]
    port = server.add_insecure_port(address)
    server.start()
    return server, f"{host}:{port}"


class BaselineClient:
    """The grpcio stub with the calls the benchmark makes."""

    def __init__(self, address: str) -> None:
        self._pb, services = load_protocol()
        limit = 64 * 1024 * 1024
        self._channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
            ],
        )
        self._stub = services.ParameterServerStub(self._channel)

    def create_variable(self, name: str, value: np.ndarray) -> None:
        request = self._pb.CreateVariableRequest(
            name=name, initial_value=to_tensor(self._pb, value), replace=True
        )
        self._stub.CreateVariable(request, timeout=30)

    def assign_add(self, name: str, delta: np.ndarray) -> int:
        request = self._pb.UpdateRequest(name=name, value=to_tensor(self._pb, delta))
        return int(self._stub.AssignAdd(request, timeout=30).version)

    def read(self, name: str) -> np.ndarray:
        return to_array(self._stub.Read(self._pb.ReadRequest(name=name), timeout=30).value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="127.0.0.1:0")
    args = parser.parse_args()
    server, address = serve(args.address)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"baseline ps listening on {address}", flush=True)
    while not stop.wait(1.0):
        pass
    server.stop(grace=2).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
