"""``jaxcluster worker`` / ``python -m jaxcluster.worker``: serve closures to a coordinator.

Prints exactly one line, ``jaxcluster worker listening on HOST:PORT``, once it accepts
requests. SIGTERM (or a first Ctrl-C) stops it taking closures, lets the running one
finish, and exits with status 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from jaxcluster._task_process import (
    PREVIOUS_EXIT_ENV,
    TaskSetupError,
    add_task_arguments,
    configure_logging,
    describe_exit,
    limit_settings,
    start_metrics,
    task_settings,
    tls_error,
    tls_files,
)

__all__ = ["WorkerSetupError", "add_arguments", "main", "run"]

_log = logging.getLogger("jaxcluster.worker")


#: Kept under the worker's name for callers that catch it.
WorkerSetupError = TaskSetupError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the worker's flags to ``parser``."""
    add_task_arguments(parser, job="worker", example_environment="slurm")
    parser.add_argument(
        "--max-function-bytes",
        type=int,
        default=1024**3,
        help="bytes of registered function payloads kept (default 1 GiB); the least "
        "recently used is evicted first and registered again by its coordinator when needed",
    )


def _install_signal_handlers(server: Any) -> None:
    def drain(signum: int, frame: FrameType | None) -> None:
        already = not server.begin_shutdown()
        if signum == signal.SIGINT and already:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)


def run(args: argparse.Namespace) -> int:
    """Runs a worker with parsed ``args`` until it is shut down; returns the exit status."""
    from jaxcluster._malloc import keep_freed_memory
    from jaxcluster._native import core
    from jaxcluster.metrics import MissingMetricsExtraError, serve_worker
    from jaxcluster.worker import context
    from jaxcluster.worker.devices import jax_runtime_info
    from jaxcluster.worker.executor import Executor
    from jaxcluster.worker.parent_watch import ParentWatch

    keep_freed_memory()
    try:
        configure_logging(args)
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
            max_function_bytes=args.max_function_bytes,
            previous_exit=describe_exit(os.environ.get(PREVIOUS_EXIT_ENV)),
            **limit_settings(args),
            **info,
        )
        metrics = start_metrics(args, serve_worker, server)
    except (TaskSetupError, ValueError, OSError, MissingMetricsExtraError) as exc:
        print(f"jaxcluster worker: error: {tls_error(exc, args)}", file=sys.stderr, flush=True)
        return 2

    _install_signal_handlers(server)
    watch = ParentWatch(server) if args.stop_on_stdin_eof else None
    if watch is not None:
        watch.start()
    try:
        print(f"jaxcluster worker listening on {server.address}", flush=True)
        Executor(server, index).serve()
        drained = server.shutdown(timeout=30.0)
        status = server.status()
        _log.info(
            "worker %d stopped%s after %d closures (%d failed)",
            index,
            "" if drained else " without draining in 30 s",
            status["closures_run"],
            status["closures_failed"],
        )
    finally:
        if metrics is not None:
            metrics.close()
        # Joined before the interpreter finalizes: no thread of ours is left inside I/O.
        if watch is not None:
            watch.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m jaxcluster.worker``."""
    parser = argparse.ArgumentParser(
        prog="jaxcluster worker", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
