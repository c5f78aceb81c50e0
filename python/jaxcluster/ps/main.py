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
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from jaxcluster.worker.main import TOKEN_ENV, WorkerSetupError, read_token

__all__ = ["add_arguments", "main", "run"]

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# After stdin closes (the parent died), how long the ps may take to stop.
_ORPHAN_GRACE_SECONDS = 10.0
# Between attempts to resolve the cluster while its other tasks are still starting.
_RESOLVE_RETRY_SECONDS = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ps's flags to ``parser``."""
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
        "--index", type=int, default=None, help="this task's index in the ps job (default 0)"
    )
    parser.add_argument(
        "--from-resolver",
        metavar="NAME",
        default=None,
        help="take the index (and, without --address, the port) from "
        "jaxcluster.cluster_resolver.resolve(environment=NAME), e.g. 'kubernetes'",
    )
    parser.add_argument(
        "--resolver-timeout",
        type=float,
        default=300.0,
        help="with --from-resolver: seconds to keep retrying while the cluster's other tasks "
        "are still starting (default 300)",
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
        help="exit when standard input closes (LocalCluster uses this so ps tasks never "
        "outlive their parent)",
    )


def _own_task(name: str) -> tuple[str, int]:
    """``(bind address, index)`` of this ps task from the named resolver, resolved once."""
    from jaxcluster.cluster_resolver import resolve

    resolver = resolve(environment=name)
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_id is None:
        raise WorkerSetupError(
            f"the {name!r} resolver did not determine this task's index; pass --index"
        )
    spec = resolver.cluster_spec()
    if task_type != "ps" and "ps" in spec.jobs:
        raise WorkerSetupError(
            f"the {name!r} resolver places this process as task {task_id} of job "
            f"{task_type!r}, not of job 'ps'; start it with `jaxcluster worker`, or fix the "
            "task type (e.g. JAXCLUSTER_TASK_TYPE=ps)"
        )
    # Without a 'ps' job the launch holds ps tasks only (e.g. one srun step per role), so
    # the job the resolver names is this one.
    address = spec.task_address(task_type or "worker", task_id)
    port = address.rsplit(":", 1)[-1]
    # The resolved host is how others reach us; listen on every interface at that port.
    return f"0.0.0.0:{port}", int(task_id)


def _from_resolver(name: str, timeout: float) -> tuple[str, int]:
    """:func:`_own_task`, retried while the cluster is still coming up (e.g. Kubernetes
    pods not yet Running) until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        try:
            return _own_task(name)
        except WorkerSetupError:
            raise
        except RuntimeError as exc:  # peers not ready yet: worth another look
            if time.monotonic() >= deadline:
                raise WorkerSetupError(
                    f"--from-resolver {name!r} still failed after {timeout:g} s: {exc}"
                ) from exc
            print(f"jaxcluster ps: waiting for the cluster: {exc}", file=sys.stderr, flush=True)
            time.sleep(_RESOLVE_RETRY_SECONDS)
        except (ValueError, KeyError, TypeError, ImportError) as exc:
            raise WorkerSetupError(f"--from-resolver {name!r} failed: {exc}") from exc


def _settings(args: argparse.Namespace) -> tuple[str | None, str, int]:
    """``(token, address, index)`` from flags, environment and resolver."""
    token = read_token(args.auth_token_file)
    address, index = args.address, args.index
    if args.from_resolver is not None:
        resolved_address, resolved_index = _from_resolver(args.from_resolver, args.resolver_timeout)
        address = address or resolved_address
        index = resolved_index if index is None else index
    index = 0 if index is None else index
    if index < 0:
        raise WorkerSetupError(f"--index {index} is negative; expected 0 or more")
    return token, address or "127.0.0.1:0", index


def _install_stop_triggers(stop: threading.Event, watch_stdin: bool) -> None:
    import signal

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if watch_stdin:

        def watch() -> None:
            # os.read on the descriptor, not sys.stdin.buffer: a daemon thread blocked in
            # the buffered reader aborts interpreter shutdown ("could not acquire lock").
            try:
                while os.read(0, 65536):
                    pass
            except OSError:
                pass
            stop.set()

        threading.Thread(target=watch, name="jaxcluster-stdin-watch", daemon=True).start()


def _shutdown(server: Any) -> None:
    # A server that cannot stop in time must not keep the process alive.
    killer = threading.Timer(_ORPHAN_GRACE_SECONDS, os._exit, args=(1,))
    killer.daemon = True
    killer.start()
    server.shutdown()
    killer.cancel()


def run(args: argparse.Namespace) -> int:
    """Runs a ps with parsed ``args`` until SIGTERM; returns the exit status."""
    from jaxcluster._native import core

    try:
        token, address, index = _settings(args)
        server = core.PsServer(
            address, auth_token=token, index=index, max_message_bytes=args.max_message_bytes
        )
    except (WorkerSetupError, ValueError, OSError) as exc:
        print(f"jaxcluster ps: error: {exc}", file=sys.stderr, flush=True)
        return 2

    stop = threading.Event()
    _install_stop_triggers(stop, args.stop_on_stdin_eof)
    print(f"jaxcluster ps listening on {server.address}", flush=True)
    # Requests are served on Rust threads; this thread only waits, waking each second so
    # signal handlers run promptly.
    while not stop.wait(1.0):
        pass
    _shutdown(server)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m jaxcluster.ps``."""
    parser = argparse.ArgumentParser(
        prog="jaxcluster ps", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
