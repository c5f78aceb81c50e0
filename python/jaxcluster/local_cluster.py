"""LocalCluster: real worker processes on 127.0.0.1, for tests, demos and laptops.

Each worker is ``python -m jaxcluster.worker`` (each ps task ``python -m jaxcluster.ps``) on
a free port with a fresh random token (passed through the environment, never on the
command line). Tasks never outlive the cluster: ``stop()`` runs at exit and when the
object is collected, and each task watches its standard input, which only this process
holds open, so a parent that dies even by SIGKILL takes its tasks with it. Workers and ps
tasks are each a ``TaskGroup`` (``_local_tasks.py``): one copy of the process handling.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from jaxcluster._auth import AUTH_TOKEN_ENV
from jaxcluster._local_tasks import TaskGroup

__all__ = ["LocalCluster"]


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

        # 2 slices of 2 hosts with 2 CPU devices each: every closure runs on 4 devices.
        with LocalCluster(num_workers=4, hosts_per_slice=2, devices_per_host=2) as cluster:
            coordinator = cluster.coordinator()   # hosts_per_slice=2 already set
            coordinator.schedule(lambda: jax.device_count()).fetch()   # 4

    With ``hosts_per_slice=K`` (K > 1) workers ``i*K .. i*K+K-1`` form slice ``i``: each host
    is a supervised ``jaxcluster worker --slice-size K`` whose process is started again
    when its slice breaks, and :meth:`kill_worker` SIGKILLs one host's process (its
    supervisor starts it again, so the slice re-forms by itself). ``devices_per_host=N``
    gives every worker N forced CPU devices (``XLA_FLAGS``, ``JAX_PLATFORMS=cpu``).
    ``state_ttl=S`` starts every task with ``--state-ttl S``: a coordinator that vanished
    without shutting down has its values released S seconds later (default 3600).
    """

    def __init__(
        self,
        num_workers: int = 2,
        *,
        num_ps: int = 0,
        env: Mapping[str, str] | None = None,
        worker_args: Sequence[str] = (),
        start_timeout: float = 120.0,
        hosts_per_slice: int = 1,
        devices_per_host: int | None = None,
        state_ttl: float | None = None,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r}; expected an int of at least 1")
        if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
            raise ValueError(f"num_ps={num_ps!r}; expected an int of at least 0")
        if isinstance(worker_args, str):
            raise TypeError("worker_args must be a sequence of strings, not one string")
        _check_count("hosts_per_slice", hosts_per_slice)
        if num_workers % hosts_per_slice:
            raise ValueError(
                f"num_workers={num_workers} is not a multiple of hosts_per_slice="
                f"{hosts_per_slice}; every slice needs all its hosts"
            )
        if devices_per_host is not None:
            _check_count("devices_per_host", devices_per_host)
        self._hosts_per_slice = hosts_per_slice
        # Every task keeps a vanished coordinator's state this long (--state-ttl).
        ttl_args = () if state_ttl is None else ("--state-ttl", repr(float(state_ttl)))
        worker_args = (*worker_args, *ttl_args)
        self._token = secrets.token_hex(16)
        self._env = {**os.environ, **(env or {}), AUTH_TOKEN_ENV: self._token}
        if devices_per_host is not None:
            flags = self._env.get("XLA_FLAGS", "")
            flag = f"--xla_force_host_platform_device_count={devices_per_host}"
            self._env["XLA_FLAGS"] = f"{flags} {flag}".strip()
            self._env["JAX_PLATFORMS"] = "cpu"
        # Output is forwarded line by line; unbuffered tasks keep it in order and timely.
        self._env.setdefault("PYTHONUNBUFFERED", "1")
        # Its tasks' output is forwarded into this process: only their warnings by default
        # (env={"JAXCLUSTER_LOG_LEVEL": "INFO"} shows their INFO lines too).
        self._env.setdefault("JAXCLUSTER_LOG_LEVEL", "WARNING")
        self._start_timeout = start_timeout
        self._stopped = False
        self._workers = TaskGroup(
            "worker",
            num_workers,
            self._env,
            self._token,
            worker_args,
            per_task=_slice_flags(hosts_per_slice, num_workers),
            own_group=hosts_per_slice > 1,
        )
        self._ps = TaskGroup("ps", num_ps, self._env, self._token, ttl_args)
        try:
            self._ps.start_all(start_timeout)
            self._workers.start_all(start_timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of every worker, by index."""
        return self._workers.addresses

    @property
    def auth_token(self) -> str:
        """The token the workers require (also what a coordinator should be given)."""
        return self._token

    @property
    def num_workers(self) -> int:
        """How many workers the cluster has (live or not)."""
        return self._workers.count

    @property
    def resolver(self) -> Any:
        """A ``SimpleClusterResolver`` whose ``worker`` job lists :attr:`addresses` (and,
        with ``num_ps``, whose ``ps`` job lists :attr:`ps_addresses`)."""
        from jaxcluster.cluster_resolver import SimpleClusterResolver
        from jaxcluster.cluster_spec import ClusterSpec

        jobs = {"worker": self.addresses}
        if self._ps.count:
            jobs["ps"] = self.ps_addresses
        return SimpleClusterResolver(ClusterSpec(jobs), rpc_layer="grpc")

    def coordinator(self, **kwargs: Any) -> Any:
        """A ``ClusterCoordinator`` for this cluster's workers, with its token.

        ``kwargs`` go to ``ClusterCoordinator`` (``error_policy``, ``closure_timeout``...).

        Example::

            with LocalCluster(2) as cluster, cluster.coordinator() as coordinator:
                coordinator.schedule(lambda: 1).fetch()  # 1
        """
        from jaxcluster.coordinator import ClusterCoordinator

        self._check_running()
        kwargs.setdefault("auth_token", self._token)
        if self._hosts_per_slice > 1:
            kwargs.setdefault("hosts_per_slice", self._hosts_per_slice)
        return ClusterCoordinator(self.resolver, **kwargs)

    @property
    def hosts_per_slice(self) -> int:
        """How many workers form one slice (1: every worker is its own)."""
        return self._hosts_per_slice

    @property
    def slices(self) -> list[list[str]]:
        """The workers' addresses grouped by slice (one address per slice when
        ``hosts_per_slice`` is 1)."""
        k, addresses = self._hosts_per_slice, self.addresses
        return [addresses[i : i + k] for i in range(0, len(addresses), k)]

    def worker_pid(self, index: int) -> int | None:
        """The pid of worker ``index``'s serving process, or ``None`` if it is not running
        (in a slice: the process its supervisor runs now, asked of the worker itself)."""
        self._check_running()
        pid = self._workers.pid(index)
        if pid is None or self._hosts_per_slice == 1:
            return pid
        from jaxcluster import errors
        from jaxcluster._native import core

        client = core.WorkerClient(self.addresses[index], auth_token=self._token, timeout=5.0)
        try:
            return client.get_status().pid
        except errors.JaxClusterError:
            return None

    def kill_worker(self, index: int, *, supervisor: bool = False) -> None:
        """Kills worker ``index`` with SIGKILL and reaps it (a crash, not a shutdown). In
        a slice this kills the host's serving process only: its supervisor starts it again
        and the slice re-forms; with ``supervisor=True`` the supervisor dies too and the
        host stays down until :meth:`restart_worker`."""
        self._check_running()
        if self._hosts_per_slice == 1 or supervisor:
            self._workers.kill(index)
            return
        pid = self.worker_pid(index)
        if pid is None:
            raise RuntimeError(f"worker {index} is not serving; there is no process to kill")
        os.kill(pid, signal.SIGKILL)

    def restart_worker(self, index: int) -> None:
        """Starts worker ``index`` again on its old address (killing it first if alive) and
        waits until it answers ``GetStatus``."""
        self._check_running()
        self._workers.restart(index, self._start_timeout)

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
        self._workers.stop()
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
        return f"LocalCluster(num_workers={self.num_workers}, {state}, addresses={self.addresses})"


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}; expected an int of at least 1")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _slice_flags(hosts_per_slice: int, num_workers: int) -> Callable[[int], list[str]] | None:
    """Each worker's slice flags: slice ``i // K``, rank ``i % K``, the slice's own
    ``jax.distributed`` coordinator port (picked once: a restarted host finds its slice)."""
    if hosts_per_slice == 1:
        return None
    ports = [_free_port() for _ in range(num_workers // hosts_per_slice)]

    def flags(index: int) -> list[str]:
        slice_index, rank = divmod(index, hosts_per_slice)
        return [
            "--slice-size",
            str(hosts_per_slice),
            "--slice-index",
            str(slice_index),
            "--slice-rank",
            str(rank),
            "--slice-coordinator",
            f"127.0.0.1:{ports[slice_index]}",
        ]

    return flags
