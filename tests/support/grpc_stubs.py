"""grpcio stubs of ``protos/jaxcluster/v1/worker.proto``, compiled once per test session.

protobuf keeps one default descriptor pool per process, so the proto may be loaded into it
once: every test module that talks to a worker from grpcio shares these modules.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).resolve().parents[2] / "protos" / "jaxcluster" / "v1" / "worker.proto"
_lock = threading.Lock()
_stubs: tuple[ModuleType, ModuleType] | None = None


def worker_stubs() -> tuple[ModuleType, ModuleType]:
    """``(pb2, pb2_grpc)`` for the worker service; needs ``grpcio-tools``."""
    global _stubs
    with _lock:
        if _stubs is None:
            from grpc_tools import protoc

            # Compiled from a copy at the include root, so the generated modules are
            # top-level (`jaxcluster_worker_pb2`) rather than `jaxcluster.v1.*`, which would
            # collide with this package. The proto package, and so every RPC path on the
            # wire, is unchanged.
            out = Path(tempfile.mkdtemp(prefix="grpc_stubs"))
            shutil.copy(PROTO, out / "jaxcluster_worker.proto")
            code = protoc.main(
                [
                    "grpc_tools.protoc",
                    f"-I{out}",
                    f"--python_out={out}",
                    f"--grpc_python_out={out}",
                    str(out / "jaxcluster_worker.proto"),
                ]
            )
            assert code == 0, "grpc_tools.protoc failed to compile worker.proto"
            sys.path.insert(0, str(out))
            try:
                pb2 = importlib.import_module("jaxcluster_worker_pb2")
                _stubs = (pb2, importlib.import_module("jaxcluster_worker_pb2_grpc"))
            finally:
                sys.path.remove(str(out))
        return _stubs
