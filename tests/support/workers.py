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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxcluster._native import core

LISTENING = re.compile(r"^jaxcluster worker listening on (\S+)$")
START_TIMEOUT = 120.0


@dataclass
class WorkerProc:
    """A worker subprocess whose output is collected by a reader thread."""

    popen: subprocess.Popen[str]
    address: str
    token: str | None
    lines: list[str] = field(default_factory=list)

    def client(self, token: str | None = None, **kw: Any) -> Any:
        return core.WorkerClient(self.address, auth_token=token or self.token, **kw)


def _reader(popen: subprocess.Popen[str], lines: list[str], first: queue.Queue[str]) -> None:
    assert popen.stdout is not None
    for line in popen.stdout:
        lines.append(line.rstrip("\n"))
        first.put(line.rstrip("\n"))
    first.put("")


def launch(
    args: Sequence[str] = (), *, token: str | None = "test-token", env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], list[str], queue.Queue[str]]:
    """Starts a worker process; returns it, its collected stdout lines and a line queue."""
    full_env = {k: v for k, v in os.environ.items() if k != "JAXCLUSTER_AUTH_TOKEN"}
    full_env["PYTHONUNBUFFERED"] = "1"
    if token is not None:
        full_env["JAXCLUSTER_AUTH_TOKEN"] = token
    full_env.update(env or {})
    popen = subprocess.Popen(
        [sys.executable, "-m", "jaxcluster.worker", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    lines: list[str] = []
    first: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_reader, args=(popen, lines, first), daemon=True).start()
    return popen, lines, first


def wait_listening(popen: subprocess.Popen[str], first: queue.Queue[str]) -> str:
    """The address from the first stdout line (which must be the listening line)."""
    line = first.get(timeout=START_TIMEOUT)
    match = LISTENING.match(line)
    if match is None:
        popen.kill()
        _, err = popen.communicate()
        raise AssertionError(f"expected the listening line, got {line!r}; stderr:\n{err}")
    return match.group(1)


@contextlib.contextmanager
def running_worker(
    args: Sequence[str] = (), *, token: str | None = "test-token", env: dict[str, str] | None = None
) -> Iterator[WorkerProc]:
    """A ready worker, SIGKILLed and reaped on exit if it is still running."""
    popen, lines, first = launch(args, token=token, env=env)
    try:
        address = wait_listening(popen, first)
        yield WorkerProc(popen, address, token, lines)
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.communicate()


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Polls ``condition`` until it holds, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        # A short pause between polls; the deadline above bounds the whole wait.
        threading.Event().wait(0.01)


def pid_gone(pid: int) -> bool:
    """Whether no process (not even a zombie we could reap) has ``pid``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); treat it as gone once its state is Z.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state == "Z"
    return False
