"""``jaxcluster ps`` / ``python -m jaxcluster.ps``: serve variables to a coordinator and its
workers.

Takes the worker's flags (``--address``, ``--auth-token-file``, ``--index``,
``--from-resolver``), prints exactly one line, ``jaxcluster ps listening on HOST:PORT``, once
it accepts requests, and exits with status 0 on SIGTERM (or a first Ctrl-C). Variables live
in memory only: a restarted ps starts empty, and training resumes from a checkpoint
(``ParameterServerStrategy.save``/``restore``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from jaxcluster._task_process import (
    TaskSetupError,
    add_task_arguments,
    configure_logging,
    end_process,
    limit_settings,
    start_metrics,
    task_settings,
    tls_error,
    tls_files,
    watch_stdin,
)

__all__ = ["add_arguments", "main", "run"]

# After stdin closes (the parent died), how long the ps may take to stop.
_ORPHAN_GRACE_SECONDS = 10.0
_log = logging.getLogger("jaxcluster.ps")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ps's flags (the worker's) to ``parser``."""
    add_task_arguments(parser, job="ps", example_environment="kubernetes")


def _install_stop_triggers(stop: threading.Event, stop_on_stdin_eof: bool) -> None:
    import signal

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and stop.is_set():
            raise KeyboardInterrupt
        # No logging here (not safe in a signal handler): the main loop logs the stop.
        stop.reason = signal.Signals(signum).name  # type: ignore[attr-defined]
        stop.set()

    def on_eof() -> None:
        stop.reason = "standard input closed (the parent process is gone)"  # type: ignore[attr-defined]
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if stop_on_stdin_eof:
        watch_stdin(on_eof)


def _shutdown(server: Any) -> None:
    # A server that cannot stop in time must not keep the process alive.
    killer = threading.Timer(_ORPHAN_GRACE_SECONDS, os._exit, args=(1,))
    killer.daemon = True
    killer.start()
    server.shutdown()
    killer.cancel()


def run(args: argparse.Namespace) -> int:
    """Runs a ps with parsed ``args`` until SIGTERM; returns the exit status."""
    from jaxcluster._malloc import keep_freed_memory
    from jaxcluster._native import core
    from jaxcluster.metrics import MissingMetricsExtraError, serve_ps

    keep_freed_memory()

    try:
        configure_logging(args)
        token, address, index = task_settings(args, job="ps", prog="jaxcluster ps")
        tls_cert, tls_key = tls_files(args)
        server = core.PsServer(
            address,
            auth_token=token,
            index=index,
            max_message_bytes=args.max_message_bytes,
            tls_cert=tls_cert,
            tls_key=tls_key,
            state_ttl=args.state_ttl,
            **limit_settings(args),
        )
        metrics = start_metrics(args, serve_ps, server)
    except (TaskSetupError, ValueError, OSError, MissingMetricsExtraError) as exc:
        print(f"jaxcluster ps: error: {tls_error(exc, args)}", file=sys.stderr, flush=True)
        return 2

    stop = threading.Event()
    _install_stop_triggers(stop, args.stop_on_stdin_eof)
    print(f"jaxcluster ps listening on {server.address}", flush=True)
    # Requests are served on Rust threads; this thread only waits, waking each second so
    # signal handlers run promptly.
    while not stop.wait(1.0):
        pass
    status = server.status()
    _log.info(
        "ps %d stopping (%s): %d variables (%d bytes) held, %d updates and %d reads served; "
        "variables live in memory only and are gone once it stops",
        index,
        getattr(stop, "reason", "stopped"),
        status["variables"],
        status["variable_bytes"],
        status["updates"],
        status["reads"],
    )
    if metrics is not None:
        metrics.close()
    _shutdown(server)
    end_process(0)  # not by finalizing under the runtime's live threads (end_process)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m jaxcluster.ps``."""
    parser = argparse.ArgumentParser(
        prog="jaxcluster ps", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
