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
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["add_arguments", "main", "run"]

TOKEN_ENV = "JAXCLUSTER_AUTH_TOKEN"
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# After stdin closes (the parent died), how long the worker may take to drain.
_ORPHAN_GRACE_SECONDS = 10.0


class WorkerSetupError(Exception):
    """A flag or environment value the worker cannot start with."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the worker's flags to ``parser``."""
    parser.add_argument(
        "--address",
        default=None,
        help="HOST:PORT to bind (default 127.0.0.1:0; port 0 picks a free port). A "
        "non-loopback address needs a token.",
    )
    parser.add_argument(
        "--auth-token-file",
        type=Path,
        default=None,
        help=f"file holding the token every request must carry (surrounding whitespace "
        f"ignored); else ${TOKEN_ENV}",
    )
    parser.add_argument(
        "--index", type=int, default=None, help="this worker's index in its job (default 0)"
    )
    parser.add_argument(
        "--from-resolver",
        metavar="NAME",
        default=None,
        help="take the index (and, without --address, the port) from "
        "jaxcluster.cluster_resolver.resolve(environment=NAME), e.g. 'slurm'",
    )
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="largest request or response in bytes (default 64 MiB)",
    )
    parser.add_argument(
        "--stop-on-stdin-eof",
        action="store_true",
        help="drain and exit when standard input closes (LocalCluster uses this so workers "
        "never outlive their parent)",
    )


def read_token(token_file: Path | None) -> str | None:
    """The token from ``token_file`` (whitespace stripped), else from the environment."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise WorkerSetupError(f"cannot read --auth-token-file {token_file}: {exc}") from exc
        if not token:
            raise WorkerSetupError(
                f"--auth-token-file {token_file} is empty; expected the token on one line"
            )
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


def _from_resolver(name: str) -> tuple[str, int]:
    """``(bind address, index)`` for this task from the named resolver environment."""
    try:
        from jaxcluster.cluster_resolver import resolve
    except ImportError as exc:
        raise WorkerSetupError(
            f"--from-resolver {name!r} needs jaxcluster.cluster_resolver.resolve, which this "
            f"installation does not provide ({exc}); pass --address and --index instead"
        ) from exc
    try:
        resolver = resolve(environment=name)
        task_type, task_id = resolver.task_type, resolver.task_id
        if task_id is None:
            raise WorkerSetupError(
                f"the {name!r} resolver did not determine this task's index; pass --index"
            )
        address = resolver.cluster_spec().task_address(task_type or "worker", task_id)
    except (ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise WorkerSetupError(f"--from-resolver {name!r} failed: {exc}") from exc
    port = address.rsplit(":", 1)[-1]
    # The resolved host is how others reach us; listen on every interface at that port.
    return f"0.0.0.0:{port}", int(task_id)


def _install_signal_handlers(server: Any) -> None:
    def drain(signum: int, frame: FrameType | None) -> None:
        already = not server.begin_shutdown()
        if signum == signal.SIGINT and already:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)


def _watch_stdin(server: Any) -> None:
    def watch() -> None:
        # os.read on the descriptor, not sys.stdin.buffer: a daemon thread blocked in the
        # buffered reader aborts interpreter shutdown ("could not acquire lock"), as the ps
        # does too.
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass
        server.begin_shutdown()
        killer = threading.Timer(_ORPHAN_GRACE_SECONDS, os._exit, args=(1,))
        killer.daemon = True
        killer.start()

    threading.Thread(target=watch, name="jaxcluster-stdin-watch", daemon=True).start()


def run(args: argparse.Namespace) -> int:
    """Runs a worker with parsed ``args`` until it is shut down; returns the exit status."""
    from jaxcluster._native import core
    from jaxcluster.worker import context
    from jaxcluster.worker.devices import jax_runtime_info
    from jaxcluster.worker.executor import Executor

    try:
        token = read_token(args.auth_token_file)
        # Closures reach parameter servers with the token this worker was started with.
        context.set_worker_auth_token(token)
        address, index = args.address, args.index
        if args.from_resolver is not None:
            resolved_address, resolved_index = _from_resolver(args.from_resolver)
            address = address or resolved_address
            index = resolved_index if index is None else index
        address = address or "127.0.0.1:0"
        index = 0 if index is None else index
        if index < 0:
            raise WorkerSetupError(f"--index {index} is negative; expected 0 or more")
        info = jax_runtime_info(index)
        server = core.WorkerServer(
            address,
            auth_token=token,
            worker_index=index,
            max_message_bytes=args.max_message_bytes,
            **info,
        )
    except (WorkerSetupError, ValueError, OSError) as exc:
        print(f"jaxcluster worker: error: {exc}", file=sys.stderr, flush=True)
        return 2

    _install_signal_handlers(server)
    if args.stop_on_stdin_eof:
        _watch_stdin(server)
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
