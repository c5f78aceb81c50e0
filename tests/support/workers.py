"""Starting real worker processes for tests: `python -m jaxcluster.worker` on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from jaxcluster._native import core

LISTENING = re.compile(r"^jaxcluster worker listening on (\S+)$")
START_TIMEOUT = 120.0


class WorkerProc:
    """A worker subprocess; reader threads collect its stdout and stderr lines."""

    def __init__(self, popen: subprocess.Popen[str], token: str | None) -> None:
        self.popen = popen
        self.token = token
        self.address = ""
        self.lines: list[str] = []
        self.err_lines: list[str] = []
        self._stdout_lines: queue.Queue[str | None] = queue.Queue()
        assert popen.stdout is not None and popen.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(popen.stdout, self.lines, True)),
            threading.Thread(target=self._read, args=(popen.stderr, self.err_lines, False)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()

    def _read(self, stream: IO[str], lines: list[str], announce: bool) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))
            if announce:
                self._stdout_lines.put(lines[-1])
        if announce:
            self._stdout_lines.put(None)

    def wait_listening(self) -> str:
        """Reads the first stdout line, which must be the listening line."""
        try:
            line = self._stdout_lines.get(timeout=START_TIMEOUT)
        except queue.Empty:
            line = None
        match = LISTENING.match(line or "")
        if match is None:
            self.finish(kill=True)
            raise AssertionError(
                f"expected the listening line, got {line!r}; stderr:\n{self.stderr}"
            )
        self.address = match.group(1)
        return self.address

    def finish(self, timeout: float = 120.0, *, kill: bool = False) -> int:
        """Waits for the process (killing it first if asked) and for all its output."""
        if kill and self.popen.poll() is None:
            self.popen.kill()
        code = self.popen.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=timeout)
        return code

    @property
    def stderr(self) -> str:
        return "\n".join(self.err_lines)

    def client(self, token: str | None = None, **kw: Any) -> Any:
        return core.WorkerClient(self.address, auth_token=token or self.token, **kw)


def launch(
    args: Sequence[str] = (),
    *,
    token: str | None = "test-token",
    env: dict[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> WorkerProc:
    """Starts a worker process (without waiting for it to be ready); ``prefix`` is a
    command to run it under (e.g. ``unshare --pid --fork``)."""
    full_env = {k: v for k, v in os.environ.items() if k != "JAXCLUSTER_AUTH_TOKEN"}
    full_env["PYTHONUNBUFFERED"] = "1"
    if token is not None:
        full_env["JAXCLUSTER_AUTH_TOKEN"] = token
    full_env.update(env or {})
    popen = subprocess.Popen(
        [*prefix, sys.executable, "-m", "jaxcluster.worker", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    return WorkerProc(popen, token)


@contextlib.contextmanager
def running_worker(
    args: Sequence[str] = (), *, token: str | None = "test-token", env: dict[str, str] | None = None
) -> Iterator[WorkerProc]:
    """A ready worker, SIGKILLed and reaped on exit if it is still running."""
    worker = launch(args, token=token, env=env)
    try:
        worker.wait_listening()
        yield worker
    finally:
        worker.finish(kill=True)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Polls ``condition`` until it holds, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        # A short pause between polls; the deadline above bounds the whole wait.
        threading.Event().wait(0.01)


def pid_gone(pid: int) -> bool:
    """Whether no live process has ``pid`` (a zombie awaiting its parent counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state == "Z"
    return False
