"""``jaxcluster worker`` / ``python -m jaxcluster.worker``: serve closures to a coordinator.

Prints exactly one line, ``jaxcluster worker listening on HOST:PORT``, once it accepts
requests. SIGTERM (or a first Ctrl-C) stops it taking closures, lets the running one
finish, and exits with status 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from jaxcluster._task_process import (
    TaskSetupError,
    add_task_arguments,
    task_settings,
    tls_error,
    tls_files,
    watch_stdin,
)

__all__ = ["WorkerSetupError", "add_arguments", "main", "run"]

# After stdin closes (the parent died), how long the worker may take to drain.
_ORPHAN_GRACE_SECONDS = 10.0

#: Kept under the worker's name for callers that catch it.
WorkerSetupError = TaskSetupError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the worker's flags to ``parser``."""
    add_task_arguments(parser, job="worker", example_environment="slurm")


def _install_signal_handlers(server: Any) -> None:
    def drain(signum: int, frame: FrameType | None) -> None:
        already = not server.begin_shutdown()
        if signum == signal.SIGINT and already:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)


def _drain_orphan(server: Any) -> None:
    server.begin_shutdown()
    # A worker whose parent is gone must not linger if draining hangs.
    killer = threading.Timer(_ORPHAN_GRACE_SECONDS, os._exit, args=(1,))
    killer.daemon = True
    killer.start()


def run(args: argparse.Namespace) -> int:
    """Runs a worker with parsed ``args`` until it is shut down; returns the exit status."""
    from jaxcluster._native import core
    from jaxcluster.worker import context
    from jaxcluster.worker.devices import jax_runtime_info
    from jaxcluster.worker.executor import Executor

    try:
        token, address, index = task_settings(args, job="worker", prog="jaxcluster worker")
        # Closures reach parameter servers with the token this worker was started with.
        context.set_worker_auth_token(token)
        tls_cert, tls_key = tls_files(args)
        info = jax_runtime_info(index)
        server = core.WorkerServer(
            address,
            auth_token=token,
            tls_cert=tls_cert,
            tls_key=tls_key,
            worker_index=index,
            max_message_bytes=args.max_message_bytes,
            **info,
        )
    except (TaskSetupError, ValueError, OSError) as exc:
        print(f"jaxcluster worker: error: {tls_error(exc, args)}", file=sys.stderr, flush=True)
        return 2

    _install_signal_handlers(server)
    if args.stop_on_stdin_eof:
        watch_stdin(lambda: _drain_orphan(server))
    print(f"jaxcluster worker listening on {server.address}", flush=True)
    Executor(server, index).serve()
    server.shutdown(timeout=30.0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m jaxcluster.worker``."""
    parser = argparse.ArgumentParser(
        prog="jaxcluster worker", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
