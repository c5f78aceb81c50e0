"""The baseline for ``coordinator_bench.py``: TF's coordinator design in pure Python.

A closure queue with TF's algorithm (``benches/ref_queue.py`` when present, else the small
one below), one thread per worker taking closures one at a time and calling the worker
with a blocking ``grpcio`` stub, and results handed back through ``threading.Event``s —
what TF's ``ClusterCoordinator`` does, over plain gRPC. The workers are
``grpc_baseline_server.py`` processes.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle

BENCHES = Path(__file__).resolve().parent
PROTO = BENCHES.parent / "protos" / "jaxcluster" / "v1" / "worker.proto"


class _TFQueue:
    """TF's closure-queue algorithm (condition variables over a deque), reduced to what the
    baseline uses: put, get, mark_finished, wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._queue: collections.deque[Any] = collections.deque()
        self._inflight = 0

    def put(self, closure: Any) -> None:
        with self._lock:
            self._queue.append(closure)
            self._not_empty.notify()

    def get(self, timeout: float | None = None) -> Any:
        with self._lock:
            while not self._queue:
                if not self._not_empty.wait(timeout):
                    return None
            self._inflight += 1
            return self._queue.popleft()

    def mark_finished(self) -> None:
        with self._lock:
            self._inflight -= 1
            if not self._queue and not self._inflight:
                self._idle.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        with self._lock:
            while self._queue or self._inflight:
                if not self._idle.wait(timeout):
                    return False
            return True


def _queue_class() -> Callable[[], Any]:
    """The queue helper's reference queue if it exists, else the one above."""
    if (BENCHES / "ref_queue.py").exists():
        sys.path.insert(0, str(BENCHES))
        module = importlib.import_module("ref_queue")
        for name in ("ReferenceClosureQueue", "RefClosureQueue"):
            if hasattr(module, name):
                return getattr(module, name)  # type: ignore[no-any-return]
    return _TFQueue


class _Closure:
    __slots__ = ("args", "done", "error", "function_hash", "result")

    def __init__(self, function_hash: bytes, args: Any) -> None:
        self.function_hash = function_hash
        self.args = args
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def mark_cancelled(self) -> None:
        self.error = RuntimeError("cancelled")
        self.done.set()

    def fetch(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


def compile_stubs(directory: Path) -> None:
    from grpc_tools import protoc

    shutil.copy(PROTO, directory / "jaxcluster_worker.proto")
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{directory}",
            f"--python_out={directory}",
            f"--grpc_python_out={directory}",
            str(directory / "jaxcluster_worker.proto"),
        ]
    )
    if code != 0:
        raise RuntimeError("grpc_tools.protoc could not compile worker.proto")


class BaselineCoordinator:
    """``schedule``/``join`` over grpcio stubs, TF-style, for the given addresses."""

    def __init__(self, addresses: list[str], stubs_dir: Path) -> None:
        import grpc

        sys.path.insert(0, str(stubs_dir))
        self._pb2: Any = importlib.import_module("jaxcluster_worker_pb2")
        pb2_grpc: Any = importlib.import_module("jaxcluster_worker_pb2_grpc")
        self._queue = _queue_class()()
        self._channels = [grpc.insecure_channel(a) for a in addresses]
        self._stubs = [pb2_grpc.WorkerStub(c) for c in self._channels]
        self._registered: dict[bytes, bytes] = {}
        self._hashes: dict[Callable[..., Any], bytes] = {}
        self._stop = False
        self._threads = [
            threading.Thread(target=self._serve, args=(stub,), daemon=True) for stub in self._stubs
        ]
        for thread in self._threads:
            thread.start()

    @property
    def queue_name(self) -> str:
        return type(self._queue).__name__

    def _serve(self, stub: Any) -> None:
        pb2, sent = self._pb2, set()
        while not self._stop:
            closure = self._queue.get(timeout=0.2)
            if closure is None:
                continue
            if closure.function_hash not in sent:
                stub.RegisterFunction(
                    pb2.RegisterFunctionRequest(
                        function_hash=closure.function_hash,
                        payload=self._registered[closure.function_hash],
                    )
                )
                sent.add(closure.function_hash)
            buffers: list[pickle.PickleBuffer] = []
            data = pickle.dumps(closure.args, protocol=5, buffer_callback=buffers.append)
            request = pb2.RunClosureRequest(
                function_hash=closure.function_hash,
                args=pb2.Value(pickle=data, buffers=[b.raw().tobytes() for b in buffers]),
            )
            reply = stub.RunClosure(request)
            closure.result = pickle.loads(reply.result.pickle, buffers=reply.result.buffers)
            closure.done.set()
            self._queue.mark_finished()

    def schedule(self, fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> _Closure:
        # Serialized once per function, as TF traces a tf.function once.
        function_hash = self._hashes.get(fn)
        if function_hash is None:
            payload = cloudpickle.dumps(fn)
            function_hash = self._hashes[fn] = hashlib.sha256(payload).digest()
            self._registered[function_hash] = payload
        closure = _Closure(function_hash, (args, {}))
        self._queue.put(closure)
        return closure

    def join(self) -> None:
        self._queue.wait()

    def close(self) -> None:
        self._stop = True
        for thread in self._threads:
            thread.join(timeout=5)
        for channel in self._channels:
            channel.close()


@contextlib.contextmanager
def baseline_cluster(num_workers: int) -> Iterator[BaselineCoordinator]:
    """``num_workers`` baseline servers in subprocesses and a coordinator for them."""
    with tempfile.TemporaryDirectory(prefix="jaxcluster-baseline-") as tmp:
        stubs = Path(tmp)
        compile_stubs(stubs)
        servers = [
            subprocess.Popen(
                [sys.executable, str(BENCHES / "grpc_baseline_server.py"), str(stubs)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(num_workers)
        ]
        try:
            addresses = []
            for server in servers:
                assert server.stdout is not None
                line = server.stdout.readline()
                if not line.startswith("listening on "):
                    raise RuntimeError(f"baseline server did not start: {line!r}")
                addresses.append(f"127.0.0.1:{line.split()[-1]}")
            coordinator = BaselineCoordinator(addresses, stubs)
            try:
                yield coordinator
            finally:
                coordinator.close()
        finally:
            for server in servers:
                with contextlib.suppress(OSError):
                    assert server.stdin is not None
                    server.stdin.close()
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
