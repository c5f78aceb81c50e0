"""The baseline's worker: a plain ``grpcio`` server in Python for ``jaxcluster.v1.Worker``.

Implements ``RegisterFunction`` and ``RunClosure`` the straightforward way (pickle in,
call, pickle out; one closure at a time), as a pure-Python coordinator/worker pair would.
Run by ``grpc_baseline.py``; prints ``listening on PORT`` when ready.

    python benches/grpc_baseline_server.py STUBS_DIR
"""

from __future__ import annotations

import importlib
import pickle
import sys
import threading
from concurrent import futures
from typing import Any


def serve(stubs_dir: str) -> None:
    import grpc

    sys.path.insert(0, stubs_dir)
    pb2: Any = importlib.import_module("jaxcluster_worker_pb2")
    pb2_grpc: Any = importlib.import_module("jaxcluster_worker_pb2_grpc")

    class Worker(pb2_grpc.WorkerServicer):  # type: ignore[misc]
        def __init__(self) -> None:
            self.functions: dict[bytes, Any] = {}
            self.run_lock = threading.Lock()  # one closure at a time, as a jaxcluster worker

        def RegisterFunction(self, request: Any, context: Any) -> Any:
            known = request.function_hash in self.functions
            if not known:
                self.functions[request.function_hash] = pickle.loads(request.payload)
            return pb2.RegisterFunctionResponse(already_registered=known)

        def RunClosure(self, request: Any, context: Any) -> Any:
            fn = self.functions.get(request.function_hash)
            if fn is None:
                context.abort(grpc.StatusCode.NOT_FOUND, "unknown function")
            if request.HasField("args"):
                args, kwargs = pickle.loads(request.args.pickle, buffers=request.args.buffers)
            else:
                args, kwargs = (), {}
            with self.run_lock:
                result = fn(*args, **kwargs)
            buffers: list[pickle.PickleBuffer] = []
            data = pickle.dumps(result, protocol=5, buffer_callback=buffers.append)
            value = pb2.Value(pickle=data, buffers=[b.raw().tobytes() for b in buffers])
            return pb2.RunClosureResponse(closure_id=request.closure_id, result=value)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb2_grpc.add_WorkerServicer_to_server(Worker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening on {port}", flush=True)
    sys.stdin.read()  # the parent closes stdin to stop us
    server.stop(grace=None)


if __name__ == "__main__":
    serve(sys.argv[1])
