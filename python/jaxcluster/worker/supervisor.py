"""Keeps a slice host's worker process running: ``jax.distributed`` cannot be initialised
twice in one process, so a host whose slice broke exits and this parent starts it again,
on the same address, until it is told to stop.

``jaxcluster worker --slice-size K`` (K > 1) runs as this supervisor; the serving process
is its child, given the same flags plus ``--supervised``. The child's output passes through
unchanged (its ``jaxcluster worker listening on HOST:PORT`` line each time it serves). A
child that exits with status 0 (drained after SIGTERM) or 2 (its flags or its slice are
wrong: starting it again would fail the same way) ends the supervisor with that status;
any other end (the slice broke, a crash, a SIGKILL) starts a new child after a back-off
that grows from 0.5 s to 10 s and resets once a child has served for a minute. SIGTERM
and SIGINT are passed to the child and end the supervision; if the supervisor dies, the
kernel kills the child (Linux's parent-death signal). ``JAXCLUSTER_PREVIOUS_EXIT``
tells each new child how the previous one ended (it reports it in ``GetStatus``).

Example::

    jaxcluster worker --address 10.0.0.5:8470 --index 1 \\
        --slice-index 0 --slice-rank 1 --slice-size 2 --slice-coordinator 10.0.0.4:8476
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType

from jaxcluster._task_process import PREVIOUS_EXIT_ENV

__all__ = ["supervise"]

_log = logging.getLogger("jaxcluster.worker.supervisor")
_LISTENING = re.compile(r"^jaxcluster worker listening on (\S+)\s*$")
_FINAL = (0, 2)
_BACKOFF_START, _BACKOFF_MAX, _HEALTHY_SECONDS = 0.5, 10.0, 60.0


def _with_address(argv: Sequence[str], address: str) -> list[str]:
    """``argv`` with ``--address`` set to ``address`` (a restart keeps its port)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--address":
            skip = True
            continue
        if arg.startswith("--address="):
            continue
        out.append(arg)
    return [*out, "--address", address]


def _die_with(parent: int) -> Callable[[], None]:
    """What the child runs before it starts: on Linux, the kernel SIGKILLs it if
    ``parent`` (this supervisor) dies, even by SIGKILL, so a host never outlives its
    supervisor. A parent that died between the fork and the ``prctl`` is caught by the
    parent-pid check after it."""

    def arm() -> None:
        if sys.platform.startswith("linux"):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)

    return arm


def supervise(argv: Sequence[str], environ: dict[str, str], forwarded: Sequence[int] = ()) -> int:
    """Runs ``python -m jaxcluster.worker *argv --supervised`` until it ends for good;
    returns its final exit status. SIGTERM, SIGINT and the ``forwarded`` signals (the
    ``--preemption-signal``) are passed on to the child and end the supervision."""
    stopping = threading.Event()
    child: list[subprocess.Popen[str] | None] = [None]
    address: list[str | None] = [None]

    def forward(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        process = child[0]
        if process is not None and process.poll() is None:
            process.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, *forwarded):
        signal.signal(signum, forward)
    backoff = _BACKOFF_START
    # How the process before this supervisor ended, when its launcher said so.
    previous: int | str | None = environ.get(PREVIOUS_EXIT_ENV) or None
    while True:
        args = list(argv) if address[0] is None else _with_address(argv, address[0])
        env = {k: v for k, v in environ.items() if k != PREVIOUS_EXIT_ENV}
        if previous is not None:
            env[PREVIOUS_EXIT_ENV] = str(previous)
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "jaxcluster.worker", *args, "--supervised"],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            errors="replace",
            preexec_fn=_die_with(os.getpid()),  # this process has one thread: safe here
        )
        child[0] = process
        assert process.stdout is not None
        for line in process.stdout:
            match = _LISTENING.match(line)
            if match and address[0] is None:
                address[0] = match.group(1)
            sys.stdout.write(line)
            sys.stdout.flush()
        code = process.wait()
        if stopping.is_set() or code in _FINAL:
            return code if code >= 0 else 128 - code
        if time.monotonic() - started > _HEALTHY_SECONDS:
            backoff = _BACKOFF_START
        _log.warning(
            "worker process %d ended (%s); starting it again in %.1f s",
            process.pid,
            f"status {code}" if code >= 0 else f"signal {-code}",
            backoff,
        )
        if stopping.wait(backoff):
            return 0
        backoff = min(_BACKOFF_MAX, backoff * 2)
        previous = code
