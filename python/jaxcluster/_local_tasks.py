"""Handles on the task processes a :class:`jaxcluster.LocalCluster` runs: one
``python -m jaxcluster.worker`` or ``python -m jaxcluster.ps`` subprocess per task, started,
watched until it serves, killed, restarted and stopped the same way for both jobs.

The cluster's token travels in ``env`` (never on the command line). Each process gets
``--stop-on-stdin-eof`` and a standard input only this process holds open, so a parent that
dies even by SIGKILL takes its tasks with it.

Example::

    ps = TaskGroup("ps", 2, env={**os.environ, AUTH_TOKEN_ENV: token}, token=token)
    ps.start_all(timeout=120.0)
    ps.addresses            # ['127.0.0.1:41011', '127.0.0.1:39553']
    ps.restart(1, timeout=120.0)
    ps.stop()
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from jaxcluster import errors
from jaxcluster._task_process import PREEMPTED_EXIT, PREVIOUS_EXIT_ENV, preempted_source

if TYPE_CHECKING:
    from jaxcluster._core import PsClient, PsStatus, WorkerClient, WorkerReport

__all__ = ["TaskGroup", "TaskProcess"]

_LISTENING = re.compile(r"^jaxcluster (worker|ps) listening on (\S+)\s*$")
_STOP_GRACE_SECONDS = 15.0
# Each job's tasks as error messages name them, and the LocalCluster argument counting them.
_JOBS = {"worker": ("workers", "num_workers"), "ps": ("ps tasks", "num_ps")}


class TaskProcess:
    """One task subprocess of job ``job`` (``"worker"`` or ``"ps"``) and the thread that
    forwards its output, prefixed ``[job index]``, keeping the last lines for errors."""

    def __init__(
        self,
        job: str,
        index: int,
        address: str,
        env: Mapping[str, str],
        extra: Sequence[str] = (),
        *,
        own_group: bool = False,
    ) -> None:
        if job not in _JOBS:
            raise ValueError(f"job={job!r}; expected one of {sorted(_JOBS)}")
        self.job = job
        self.index = index
        # A slice host is a supervisor and its serving child: killing the task kills both.
        self.own_group = own_group
        command = [
            sys.executable,
            "-m",
            f"jaxcluster.{job}",
            "--address",
            address,
            "--index",
            str(index),
            "--stop-on-stdin-eof",
            # Processes on this one machine: its metadata server speaks for the
            # coordinator too, so local workers read signals only (no probes).
            *(["--preemption-notice", "signal"] if job == "worker" else []),
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
            start_new_session=own_group,
        )
        self.tail: deque[str] = deque(maxlen=20)
        #: The source of the preemption notice the process said it drained after.
        self.preempted_by: str | None = None
        self._ready: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(
            target=self._read, name=f"jaxcluster-{job}-{index}-output", daemon=True
        )
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        announced = False
        for line in self.popen.stdout:
            preempted = preempted_source(line)
            if preempted is not None:  # for the next process (_how_it_ended), not the user
                self.preempted_by = preempted
                continue
            match = _LISTENING.match(line)
            if not announced and match and match.group(1) == self.job:
                announced = True
                self._ready.put(match.group(2))
                continue
            self.tail.append(line.rstrip("\n"))
            with contextlib.suppress(ValueError, OSError):  # stdout closed at shutdown
                sys.stdout.write(f"[{self.job} {self.index}] {line}")
        self._ready.put(None)

    def wait_output(self, timeout: float = 5.0) -> None:
        """Waits (bounded) until the ended process's output was read to its end."""
        self._reader.join(timeout)

    def wait_listening(self, deadline: float) -> str:
        """The address from the process's listening line; raises if it never comes."""
        try:
            address = self._ready.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            self.kill()
            raise errors.DeadlineExceededError(
                f"{self.job} {self.index} did not print its listening line in time; its last "
                f"output:\n{self.output_tail()}"
            ) from None
        if address is None:
            code = self.popen.wait()
            raise RuntimeError(
                f"{self.job} {self.index} exited with status {code} before it was ready; its "
                f"last output:\n{self.output_tail()}"
            )
        return address

    def wait_serving(
        self, client: WorkerClient | PsClient, deadline: float
    ) -> WorkerReport | PsStatus:
        """``client.get_status()`` once the process answers it (a worker or ps client for
        this process's address), checked to come from this process's index."""
        while True:
            try:
                status = client.get_status(timeout=max(0.1, deadline - time.monotonic()))
                break
            except errors.UnavailableError:
                if time.monotonic() >= deadline or not self.alive():
                    raise
                # Wait a moment before retrying; returns early if the process exits.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=0.05)
        field = f"{self.job}_index"
        reported = getattr(status, field)
        if reported != self.index:
            raise RuntimeError(
                f"the process at {client.address} reports {field} {reported}, expected "
                f"{self.index}; another process may have taken the port"
            )
        return status

    def output_tail(self) -> str:
        return "\n".join(self.tail) or "(nothing)"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL (a crash, not a shutdown), reap, and close its standard input."""
        if self.own_group:
            with contextlib.suppress(OSError):  # the whole group, even if the leader is gone
                os.killpg(self.popen.pid, signal.SIGKILL)
        elif self.alive():
            self.popen.kill()
        self.popen.wait()
        self.close_stdin()

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()


def _stop_all(processes: list[TaskProcess | None]) -> None:
    """SIGTERM every live process, wait, SIGKILL stragglers; safe to call repeatedly."""
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
            process.close_stdin()


class TaskGroup:
    """The ``count`` tasks of one job on 127.0.0.1, by index, sharing ``env`` (which
    carries ``token``) and the extra flags ``extra``.

    A task keeps its address across restarts. :meth:`stop` runs at exit and when the group
    is collected, so no task outlives it.
    """

    def __init__(
        self,
        job: str,
        count: int,
        env: Mapping[str, str],
        token: str,
        extra: Sequence[str] = (),
        *,
        per_task: Callable[[int], Sequence[str]] | None = None,
        own_group: bool = False,
    ) -> None:
        if job not in _JOBS:
            raise ValueError(f"job={job!r}; expected one of {sorted(_JOBS)}")
        self.job = job
        self._env = env
        self._token = token
        self._extra = tuple(extra)
        self._per_task = per_task
        self._own_group = own_group
        self._processes: list[TaskProcess | None] = [None] * count
        self._addresses = ["127.0.0.1:0"] * count
        self._finalizer = weakref.finalize(self, _stop_all, self._processes)

    @property
    def count(self) -> int:
        """How many tasks the group has (live or not)."""
        return len(self._processes)

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of every task, by index (``127.0.0.1:0`` before it first serves)."""
        return list(self._addresses)

    def _check(self, index: int) -> TaskProcess | None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.count:
            tasks, argument = _JOBS[self.job]
            raise ValueError(
                f"{self.job} index {index!r} is out of range; this cluster has "
                + (f"{tasks} 0..{self.count - 1}" if self.count else f"no {tasks} ({argument}=0)")
            )
        return self._processes[index]

    def _spawn(self, index: int, previous_exit: int | str | None = None) -> None:
        # A task started again learns how its predecessor ended (the worker reports it in
        # GetStatus, so a coordinator can say how the workers under a closure died).
        env = {k: v for k, v in self._env.items() if k != PREVIOUS_EXIT_ENV}
        if previous_exit is not None:
            env[PREVIOUS_EXIT_ENV] = str(previous_exit)
        extra = (*self._extra, *(self._per_task(index) if self._per_task else ()))
        self._processes[index] = TaskProcess(
            self.job, index, self._addresses[index], env, extra, own_group=self._own_group
        )

    def _await_ready(self, index: int, deadline: float) -> None:
        process = self._processes[index]
        assert process is not None
        address = process.wait_listening(deadline)
        self._addresses[index] = address
        from jaxcluster._native import core

        client_class = core.WorkerClient if self.job == "worker" else core.PsClient
        process.wait_serving(client_class(address, auth_token=self._token, timeout=5.0), deadline)

    def start_all(self, timeout: float) -> None:
        """Starts every task, then waits until each answers ``GetStatus``, all within
        ``timeout`` seconds."""
        for i in range(self.count):
            self._spawn(i)
        deadline = time.monotonic() + timeout
        for i in range(self.count):
            self._await_ready(i, deadline)

    def pid(self, index: int) -> int | None:
        """The pid of task ``index``, or ``None`` if it is not running."""
        process = self._check(index)
        return process.popen.pid if process is not None and process.alive() else None

    def kill(self, index: int) -> None:
        """Kills task ``index`` with SIGKILL and reaps it."""
        process = self._check(index)
        if process is not None:
            process.kill()

    def restart(self, index: int, timeout: float) -> None:
        """Starts task ``index`` again on its old address (killing it first if alive) and
        waits up to ``timeout`` seconds until it answers ``GetStatus``."""
        self.kill(index)
        previous = self._processes[index]
        self._spawn(index, None if previous is None else _how_it_ended(previous))
        try:
            self._await_ready(index, time.monotonic() + timeout)
        except BaseException:
            self.kill(index)
            raise

    def stop(self) -> None:
        """SIGTERM every task, SIGKILL those still alive after a grace period. Idempotent."""
        self._finalizer()


def _how_it_ended(process: TaskProcess) -> int | str | None:
    """What the next process of a task learns of ``process`` (:data:`PREVIOUS_EXIT_ENV`):
    its preemption when it said it drained after a notice, else its exit status."""
    process.wait_output()
    if process.preempted_by is not None:
        return f"{PREEMPTED_EXIT}{process.preempted_by}"
    return process.popen.returncode
