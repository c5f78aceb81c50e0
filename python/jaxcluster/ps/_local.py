"""The ps tasks of a :class:`jaxcluster.LocalCluster`: ``python -m jaxcluster.ps``
processes on 127.0.0.1, started, watched and stopped like its workers."""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from typing import Any

from jaxcluster.local_cluster import _stop_all, _WorkerProcess

__all__ = ["PsTasks"]


class PsTasks:
    """``count`` ps processes sharing ``env`` (which carries the cluster's token)."""

    def __init__(self, count: int, env: Mapping[str, str], token: str) -> None:
        self._env = env
        self._token = token
        self._processes: list[_WorkerProcess | None] = [None] * count
        self._addresses = ["127.0.0.1:0"] * count
        self._finalizer = weakref.finalize(self, _stop_all, self._processes)

    @property
    def count(self) -> int:
        return len(self._processes)

    @property
    def addresses(self) -> list[str]:
        return list(self._addresses)

    def _check(self, index: int) -> _WorkerProcess | None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.count:
            raise ValueError(
                f"ps index {index!r} is out of range; this cluster has "
                + (f"ps tasks 0..{self.count - 1}" if self.count else "no ps tasks (num_ps=0)")
            )
        return self._processes[index]

    def _spawn(self, index: int) -> None:
        self._processes[index] = _WorkerProcess(
            index, self._addresses[index], self._env, (), role="ps"
        )

    def _await_ready(self, index: int, deadline: float) -> None:
        process = self._processes[index]
        assert process is not None
        address = process.wait_listening(deadline)
        self._addresses[index] = address
        from jaxcluster._native import core

        process.wait_serving(core.PsClient(address, auth_token=self._token, timeout=5.0), deadline)

    def start_all(self, timeout: float) -> None:
        for i in range(self.count):
            self._spawn(i)
        deadline = time.monotonic() + timeout
        for i in range(self.count):
            self._await_ready(i, deadline)

    def pid(self, index: int) -> int | None:
        process = self._check(index)
        return process.popen.pid if process is not None and process.alive() else None

    def kill(self, index: int) -> None:
        process = self._check(index)
        if process is not None:
            process.kill()

    def restart(self, index: int, timeout: float) -> None:
        self.kill(index)
        self._spawn(index)
        try:
            self._await_ready(index, time.monotonic() + timeout)
        except BaseException:
            self.kill(index)
            raise

    def resolver(self, worker_addresses: list[str]) -> Any:
        from jaxcluster.cluster_resolver import SimpleClusterResolver
        from jaxcluster.cluster_spec import ClusterSpec

        spec = ClusterSpec({"worker": worker_addresses, "ps": self.addresses})
        return SimpleClusterResolver(spec, rpc_layer="grpc")

    def stop(self) -> None:
        self._finalizer()
