"""LocalCluster: real worker processes on 127.0.0.1, for tests, demos and laptops.

Each worker is ``python -m jaxcluster.worker`` (each ps task ``python -m jaxcluster.ps``) on
a free port with a fresh random token (passed through the environment, never on the
command line). Workers never outlive the cluster: ``stop()`` runs at exit and when the
object is collected, and each worker watches its standard input, which only this process
holds open, so a parent that dies even by SIGKILL takes its workers with it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from jaxcluster import errors
from jaxcluster._auth import AUTH_TOKEN_ENV

__all__ = ["LocalCluster"]

_LISTENING = re.compile(r"^jaxcluster (worker|ps) listening on (\S+)\s*$")
_STOP_GRACE_SECONDS = 15.0


class _WorkerProcess:
    """One worker (or, with ``role='ps'``, ps) subprocess and the thread that reads its
    output."""

    def __init__(
        self,
        index: int,
        address: str,
        env: Mapping[str, str],
        extra: Sequence[str],
        role: str = "worker",
    ) -> None:
        self.index = index
        self.role = role
        command = [
            sys.executable,
            "-m",
            f"jaxcluster.{role}",
            "--address",
            address,
            "--index",
            str(index),
            "--stop-on-stdin-eof",
            *extra,
        ]
        self.popen = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            text=True,
            errors="replace",
        )
        self.tail: deque[str] = deque(maxlen=20)
        self._ready: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(
            target=self._read, name=f"jaxcluster-{role}-{index}-output", daemon=True
        )
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        announced = False
        for line in self.popen.stdout:
            match = _LISTENING.match(line)
            if not announced and match and match.group(1) == self.role:
                announced = True
                self._ready.put(match.group(2))
                continue
            self.tail.append(line.rstrip("\n"))
            with contextlib.suppress(ValueError, OSError):  # stdout closed at shutdown
                sys.stdout.write(f"[{self.role} {self.index}] {line}")
        self._ready.put(None)

    def wait_listening(self, deadline: float) -> str:
        """The address from the worker's listening line; raises if it never comes."""
        try:
            address = self._ready.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            self.kill()
            raise errors.DeadlineExceededError(
                f"{self.role} {self.index} did not print its listening line in time; its last "
                f"output:\n{self.output_tail()}"
            ) from None
        if address is None:
            code = self.popen.wait()
            raise RuntimeError(
                f"{self.role} {self.index} exited with status {code} before it was ready; its "
                f"last output:\n{self.output_tail()}"
            )
        return address

    def wait_serving(self, client: Any, deadline: float) -> dict[str, Any]:
        """``client.get_status()`` once the process answers it (a worker or ps client for
        this process's address), checked to come from this process's index."""
        while True:
            try:
                status: dict[str, Any] = client.get_status(
                    timeout=max(0.1, deadline - time.monotonic())
                )
                break
            except errors.UnavailableError:
                if time.monotonic() >= deadline or not self.alive():
                    raise
                # Wait a moment before retrying; returns early if the process exits.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=0.05)
        field = f"{self.role}_index"
        if status[field] != self.index:
            raise RuntimeError(
                f"the process at {client.address} reports {field} {status[field]}, expected "
                f"{self.index}; another process may have taken the port"
            )
        return status

    def output_tail(self) -> str:
        return "\n".join(self.tail) or "(nothing)"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
        self.popen.wait()
        self._close_stdin()

    def _close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()


def _stop_all(processes: list[_WorkerProcess | None]) -> None:
    """SIGTERM every live worker, wait, SIGKILL stragglers; safe to call repeatedly."""
    live = [p for p in processes if p is not None and p.alive()]
    for p in live:
        with contextlib.suppress(OSError):
            p.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_SECONDS
    for p in live:
        try:
            p.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait()
    for process in processes:
        if process is not None:
            process._close_stdin()


class LocalCluster:
    """``num_workers`` real worker processes (and ``num_ps`` ps processes) on 127.0.0.1,
    ready when constructed.

    Example::

        with LocalCluster(num_workers=2) as cluster:
            print(cluster.addresses)          # ['127.0.0.1:41011', '127.0.0.1:39553']
            resolver = cluster.resolver       # SimpleClusterResolver with job 'worker'
            cluster.kill_worker(0)
            cluster.restart_worker(0)         # same address, answering again

        with LocalCluster(num_workers=2, num_ps=2) as cluster:
            cluster.resolver.cluster_spec().jobs   # ['worker', 'ps']
            cluster.kill_ps(1)
            cluster.restart_ps(1)             # same address, empty
    """

    def __init__(
        self,
        num_workers: int = 2,
        *,
        num_ps: int = 0,
        env: Mapping[str, str] | None = None,
        worker_args: Sequence[str] = (),
        start_timeout: float = 120.0,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r}; expected an int of at least 1")
        if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
            raise ValueError(f"num_ps={num_ps!r}; expected an int of at least 0")
        if isinstance(worker_args, str):
            raise TypeError("worker_args must be a sequence of strings, not one string")
        self._token = secrets.token_hex(16)
        self._env = {**os.environ, **(env or {}), AUTH_TOKEN_ENV: self._token}
        # Output is forwarded line by line; unbuffered workers keep it in order and timely.
        self._env.setdefault("PYTHONUNBUFFERED", "1")
        self._worker_args = tuple(worker_args)
        self._start_timeout = start_timeout
        self._processes: list[_WorkerProcess | None] = [None] * num_workers
        self._addresses: list[str] = ["127.0.0.1:0"] * num_workers
        self._stopped = False
        self._finalizer = weakref.finalize(self, _stop_all, self._processes)
        from jaxcluster.ps._local import PsTasks

        self._ps = PsTasks(num_ps, self._env, self._token)
        try:
            self._ps.start_all(start_timeout)
            for i in range(num_workers):
                self._processes[i] = _WorkerProcess(i, "127.0.0.1:0", self._env, self._worker_args)
            deadline = time.monotonic() + start_timeout
            for i in range(num_workers):
                self._await_ready(i, deadline)
        except BaseException:
            self.stop()
            raise

    def _process(self, index: int) -> _WorkerProcess | None:
        if not isinstance(index, int) or not 0 <= index < len(self._processes):
            raise ValueError(
                f"worker index {index!r} is out of range; this cluster has workers "
                f"0..{len(self._processes) - 1}"
            )
        if self._stopped:
            raise RuntimeError("this LocalCluster has been stopped")
        return self._processes[index]

    def _await_ready(self, index: int, deadline: float) -> None:
        process = self._processes[index]
        assert process is not None
        address = process.wait_listening(deadline)
        self._addresses[index] = address
        from jaxcluster._native import core

        process.wait_serving(
            core.WorkerClient(address, auth_token=self._token, timeout=5.0), deadline
        )

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of every worker, by index."""
        return list(self._addresses)

    @property
    def auth_token(self) -> str:
        """The token the workers require (also what a coordinator should be given)."""
        return self._token

    @property
    def num_workers(self) -> int:
        """How many workers the cluster has (live or not)."""
        return len(self._processes)

    @property
    def resolver(self) -> Any:
        """A ``SimpleClusterResolver`` whose ``worker`` job lists :attr:`addresses` (and,
        with ``num_ps``, whose ``ps`` job lists :attr:`ps_addresses`)."""
        if self._ps.count:
            return self._ps.resolver(self.addresses)
        from jaxcluster.cluster_resolver import SimpleClusterResolver
        from jaxcluster.cluster_spec import ClusterSpec

        return SimpleClusterResolver(ClusterSpec({"worker": self.addresses}), rpc_layer="grpc")

    def coordinator(self, **kwargs: Any) -> Any:
        """A ``ClusterCoordinator`` for this cluster's workers, with its token.

        ``kwargs`` go to ``ClusterCoordinator`` (``error_policy``, ``closure_timeout``...).

        Example::

            with LocalCluster(2) as cluster, cluster.coordinator() as coordinator:
                coordinator.schedule(lambda: 1).fetch()  # 1
        """
        from jaxcluster.coordinator import ClusterCoordinator

        if self._stopped:
            raise RuntimeError("this LocalCluster has been stopped")
        kwargs.setdefault("auth_token", self._token)
        return ClusterCoordinator(self.resolver, **kwargs)

    def worker_pid(self, index: int) -> int | None:
        """The pid of worker ``index``, or ``None`` if it is not running."""
        process = self._process(index)
        return process.popen.pid if process is not None and process.alive() else None

    def kill_worker(self, index: int) -> None:
        """Kills worker ``index`` with SIGKILL and reaps it (a crash, not a shutdown)."""
        process = self._process(index)
        if process is not None:
            process.kill()

    def restart_worker(self, index: int) -> None:
        """Starts worker ``index`` again on its old address (killing it first if alive) and
        waits until it answers ``GetStatus``."""
        process = self._process(index)
        if process is not None:
            process.kill()
        self._processes[index] = _WorkerProcess(
            index, self._addresses[index], self._env, self._worker_args
        )
        try:
            self._await_ready(index, time.monotonic() + self._start_timeout)
        except BaseException:
            self.kill_worker(index)
            raise

    @property
    def num_ps(self) -> int:
        """How many ps tasks the cluster has (live or not)."""
        return self._ps.count

    @property
    def ps_addresses(self) -> list[str]:
        """``host:port`` of every ps task, by index."""
        return self._ps.addresses

    def ps_pid(self, index: int) -> int | None:
        """The pid of ps task ``index``, or ``None`` if it is not running."""
        self._check_running()
        return self._ps.pid(index)

    def kill_ps(self, index: int) -> None:
        """Kills ps task ``index`` with SIGKILL (its variables are lost)."""
        self._check_running()
        self._ps.kill(index)

    def restart_ps(self, index: int) -> None:
        """Starts ps task ``index`` again, empty, on its old address (killing it first if
        alive), and waits until it answers ``GetStatus``."""
        self._check_running()
        self._ps.restart(index, self._start_timeout)

    def _check_running(self) -> None:
        if self._stopped:
            raise RuntimeError("this LocalCluster has been stopped")

    def stop(self) -> None:
        """Stops every worker and ps task (SIGTERM, then SIGKILL after a grace period).
        Idempotent."""
        self._stopped = True
        self._finalizer()
        self._ps.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running"
        return f"LocalCluster(num_workers={self.num_workers}, {state}, addresses={self._addresses})"
