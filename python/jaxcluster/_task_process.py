"""What every long-running task process (``jaxcluster worker``, ``jaxcluster ps``) shares:
its flags, its token, finding its own task through a resolver, and noticing its parent died.

Example::

    parser = argparse.ArgumentParser(prog="jaxcluster ps")
    add_task_arguments(parser, job="ps", example_environment="kubernetes")
    token, address, index = task_settings(parser.parse_args(), job="ps", prog="jaxcluster ps")
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypedDict

from jaxcluster._auth import AUTH_TOKEN_ENV, auth_token_from_env

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "LOG_FORMAT",
    "LOG_LEVEL_ENV",
    "PREEMPTED_EXIT",
    "PREVIOUS_EXIT_ENV",
    "TaskSetupError",
    "add_task_arguments",
    "configure_logging",
    "describe_exit",
    "end_process",
    "limit_settings",
    "preempted_line",
    "preempted_source",
    "read_token",
    "start_metrics",
    "task_settings",
    "tls_error",
    "tls_files",
    "watch_stdin",
]

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Set by whoever starts a task process again after the previous one ended (LocalCluster,
#: or a supervisor script: ``JAXCLUSTER_PREVIOUS_EXIT=$?``): how that one ended, as an exit
#: status (a shell's ``128 + N`` or Python's ``-N`` for signal N) or as text. The worker
#: reports it in ``GetStatus.previous_exit``, which the coordinator quotes when a closure
#: killed its workers (``max_closure_retries``).
PREVIOUS_EXIT_ENV = "JAXCLUSTER_PREVIOUS_EXIT"
#: A worker that drained after a preemption notice says so in its last stderr line
#: (:func:`preempted_line`); a launcher that reads it (LocalCluster) starts the next
#: process with ``JAXCLUSTER_PREVIOUS_EXIT=preempted:SOURCE``, which the worker reports as
#: ``drained after a preemption notice (SOURCE)``: a coordinator that never heard the
#: notice (the worker was gone first) still counts the preemption. The Rust link reads
#: that text (``dispatch/link/preemption.rs``, ``PREEMPTED_EXIT``).
PREEMPTED_EXIT = "preempted:"
_PREEMPTED_LINE = "jaxcluster worker ended after a preemption notice"
#: The default level of the ``jaxcluster`` loggers in a task process (``--log-level``).
LOG_LEVEL_ENV = "JAXCLUSTER_LOG_LEVEL"
#: A task process's log lines on stderr: when, how bad, which logger, what.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Between attempts to resolve the cluster while its other tasks are still starting.
_RESOLVE_RETRY_SECONDS = 2.0


class TaskSetupError(Exception):
    """A flag or environment value the task process cannot start with."""


def add_task_arguments(
    parser: argparse.ArgumentParser, *, job: str, example_environment: str
) -> None:
    """Adds the flags every task process takes to ``parser``."""
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
        help="file holding the token every request must carry (surrounding whitespace "
        f"ignored); else ${AUTH_TOKEN_ENV}",
    )
    parser.add_argument(
        "--index", type=int, default=None, help=f"this task's index in the {job} job (default 0)"
    )
    parser.add_argument(
        "--from-resolver",
        metavar="NAME",
        default=None,
        help="take the index (and, without --address, the host:port to bind: the address "
        "the cluster spec gives this task) from "
        f"jaxcluster.cluster_resolver.resolve(environment=NAME), e.g. {example_environment!r}",
    )
    parser.add_argument(
        "--resolver-timeout",
        type=float,
        default=300.0,
        help="with --from-resolver: seconds to keep retrying while the cluster's other tasks "
        "are still starting (default 300)",
    )
    parser.add_argument(
        "--state-ttl",
        type=_non_negative_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="how long what a coordinator (a session) created here is kept after its last "
        "connection closed without a clean shutdown, e.g. it was killed (default 3600; 0 "
        "releases it at once). A clean shutdown releases it at once",
    )
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="largest request or response in bytes (default 64 MiB)",
    )
    parser.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        help="serve TLS with this PEM certificate chain (needs --tls-key); clients then "
        "connect with tls_ca=",
    )
    parser.add_argument("--tls-key", type=Path, default=None, help="PEM private key for --tls-cert")
    parser.add_argument(
        "--max-connections",
        type=int,
        default=4096,
        help="connections open at once (default 4096, lowered to what the open-file limit "
        "allows); a new one over the bound closes the oldest that has not authenticated",
    )
    parser.add_argument(
        "--max-streams-per-connection",
        type=int,
        default=128,
        help="concurrent calls on one connection (default 128)",
    )
    parser.add_argument(
        "--handshake-timeout",
        type=float,
        default=5.0,
        help="seconds a new connection has to send an authenticated request before it is "
        "closed (default 5)",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=_LOG_LEVELS,
        default=None,
        help=f"level of the jaxcluster log lines on stderr (default ${LOG_LEVEL_ENV}, else "
        "INFO); other libraries' records show from WARNING",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on this port (0 picks a free one); needs "
        "pip install 'jaxcluster[metrics]'",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="interface for --metrics-port (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    parser.add_argument(
        "--stop-on-stdin-eof",
        action="store_true",
        help="stop when standard input closes (LocalCluster uses this so tasks never outlive "
        "their parent)",
    )


class LimitSettings(TypedDict):
    """The servers' connection bounds, as their keyword arguments."""

    max_connections: int
    max_streams_per_connection: int
    handshake_timeout: float


def _non_negative_seconds(text: str) -> float:
    """A ``--state-ttl`` value: seconds, at least 0."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number of seconds >= 0")
    return seconds


def limit_settings(args: argparse.Namespace) -> LimitSettings:
    """The connection bounds from the flags, as the servers take them."""
    return {
        "max_connections": args.max_connections,
        "max_streams_per_connection": args.max_streams_per_connection,
        "handshake_timeout": args.handshake_timeout,
    }


def preempted_line(source: str) -> str:
    """The last stdout line of a worker that drained after a notice from ``source``."""
    return f"{_PREEMPTED_LINE} ({source})"


def preempted_source(line: str) -> str | None:
    """The notice's source when ``line`` is a :func:`preempted_line`, else ``None``.

    Example::

        preempted_source(preempted_line("gce"))   # 'gce'
    """
    text = line.strip()
    if not (text.startswith(f"{_PREEMPTED_LINE} (") and text.endswith(")")):
        return None
    return text[len(_PREEMPTED_LINE) + 2 : -1] or None


def describe_exit(raw: str | None) -> str:
    """How a process ended, from an exit status as :data:`PREVIOUS_EXIT_ENV` carries it:
    ``"exit status 3"``, ``"killed by signal 9 (SIGKILL)"``, ``"drained after a preemption
    notice (gce)"`` (for ``preempted:gce``, see :data:`PREEMPTED_EXIT`); other text as it
    is (at most 200 characters); empty for nothing.

    Example::

        describe_exit("137")   # 'killed by signal 9 (SIGKILL)' (a shell's 128 + 9)
        describe_exit("-11")   # 'killed by signal 11 (SIGSEGV)' (Python's returncode)
    """
    text = (raw or "").strip()
    if not text:
        return ""
    if text.startswith(PREEMPTED_EXIT) and text[len(PREEMPTED_EXIT) :]:
        return f"drained after a preemption notice ({text[len(PREEMPTED_EXIT) :][:100]})"
    try:
        status = int(text)
    except ValueError:
        return text[:200]
    signum = -status if status < 0 else status - 128 if 128 < status < 160 else 0
    if signum <= 0:
        return f"exit status {status}"
    import signal

    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"killed by signal {signum}"
    return f"killed by signal {signum} ({name})"


def read_token(token_file: Path | None) -> str | None:
    """The token from ``token_file`` (whitespace stripped), else from the environment."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise TaskSetupError(f"cannot read --auth-token-file {token_file}: {exc}") from exc
        if not token:
            raise TaskSetupError(
                f"--auth-token-file {token_file} is empty; expected the token on one line"
            )
        return token
    return auth_token_from_env()


def tls_files(args: argparse.Namespace) -> tuple[bytes | None, bytes | None]:
    """``(certificate PEM, key PEM)`` from ``--tls-cert``/``--tls-key``: both or neither."""
    cert_file: Path | None = args.tls_cert
    key_file: Path | None = args.tls_key
    if (cert_file is None) != (key_file is None):
        given, missing = (
            ("--tls-cert", "--tls-key")
            if key_file is None
            else (
                "--tls-key",
                "--tls-cert",
            )
        )
        raise TaskSetupError(
            f"{given} was given without {missing}; TLS needs both --tls-cert and --tls-key"
        )
    if cert_file is None or key_file is None:
        return None, None
    pems = []
    for flag, path in (("--tls-cert", cert_file), ("--tls-key", key_file)):
        try:
            pems.append(path.read_bytes())
        except OSError as exc:
            raise TaskSetupError(f"cannot read {flag} {path}: {exc}") from exc
    return pems[0], pems[1]


def tls_error(exc: Exception, args: argparse.Namespace) -> str:
    """``exc``'s message, naming the files behind ``tls_cert``/``tls_key`` when it is
    about them (the native layer sees only their bytes)."""
    text = str(exc)
    if args.tls_cert is not None and ("tls_cert" in text or "tls_key" in text):
        text += f" (from --tls-cert {args.tls_cert} and --tls-key {args.tls_key})"
    return text


def _own_task(name: str, job: str) -> tuple[str, int]:
    """``(bind address, index)`` of this task from the named resolver, resolved once."""
    from jaxcluster.cluster_resolver import resolve

    resolver = resolve(environment=name)
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_id is None:
        raise TaskSetupError(
            f"the {name!r} resolver did not determine this task's index; pass --index"
        )
    spec = resolver.cluster_spec()
    if task_type is not None and task_type != job and job in spec.jobs:
        raise TaskSetupError(
            f"the {name!r} resolver places this process as task {task_id} of job "
            f"{task_type!r}, not of job {job!r}; start it with `jaxcluster {task_type}` if "
            f"that is a task process, or fix the task type (e.g. JAXCLUSTER_TASK_TYPE={job})"
        )
    # Without a job of our name the launch holds one role only (e.g. one srun step per
    # role), so the job the resolver names is this one.
    # Listen where the cluster spec says others reach us, not on every interface: tasks
    # sharing a machine under distinct host names then never collide on a port, and
    # nothing listens on an interface the cluster does not use. --address overrides.
    return spec.task_address(task_type or job, task_id), int(task_id)


def _from_resolver(name: str, timeout: float, job: str, prog: str) -> tuple[str, int]:
    """:func:`_own_task`, retried while the cluster is still coming up (e.g. Kubernetes
    pods not yet Running) until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        try:
            return _own_task(name, job)
        except TaskSetupError:
            raise
        except RuntimeError as exc:  # peers not ready yet: worth another look
            if time.monotonic() >= deadline:
                raise TaskSetupError(
                    f"--from-resolver {name!r} still failed after {timeout:g} s: {exc}"
                ) from exc
            print(f"{prog}: waiting for the cluster: {exc}", file=sys.stderr, flush=True)
            time.sleep(_RESOLVE_RETRY_SECONDS)
        except (ValueError, KeyError, TypeError, ImportError) as exc:
            raise TaskSetupError(f"--from-resolver {name!r} failed: {exc}") from exc


def task_settings(args: argparse.Namespace, *, job: str, prog: str) -> tuple[str | None, str, int]:
    """``(token, bind address, index)`` from the flags, the environment and the resolver."""
    token = read_token(args.auth_token_file)
    address, index = args.address, args.index
    if args.from_resolver is not None:
        resolved_address, resolved_index = _from_resolver(
            args.from_resolver, args.resolver_timeout, job, prog
        )
        address = address or resolved_address
        index = resolved_index if index is None else index
    index = 0 if index is None else index
    if index < 0:
        raise TaskSetupError(f"--index {index} is negative; expected 0 or more")
    return token, address or "127.0.0.1:0", index


def configure_logging(args: argparse.Namespace) -> None:
    """Log lines with timestamps on stderr: the process is an application, so it
    configures ``logging`` (the library only adds a ``NullHandler``). The ``jaxcluster``
    loggers log from ``--log-level`` (else ``$JAXCLUSTER_LOG_LEVEL``, else INFO), everything
    else from WARNING, so user code's own warnings in closures show too. A crash in native
    code (a closure's C extension, XLA, the Rust core) prints every thread's Python stack
    there too (:mod:`faulthandler`), so its log says where it died."""
    level = args.log_level or os.environ.get(LOG_LEVEL_ENV, "").strip().upper() or "INFO"
    if level not in _LOG_LEVELS:
        raise TaskSetupError(
            f"{LOG_LEVEL_ENV}={os.environ.get(LOG_LEVEL_ENV)!r} is not a log level; expected "
            f"one of {', '.join(_LOG_LEVELS)}"
        )
    faulthandler.enable(file=sys.stderr, all_threads=True)
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger("jaxcluster").setLevel(level)
    from jaxcluster._native import core

    core.refresh_log_levels()


def end_process(status: int) -> NoReturn:
    """Ends a task process whose server has stopped and whose last lines are written, with
    exit status ``status``: runs the ``atexit`` handlers (JAX's among them:
    ``jax.distributed`` leaves its coordination service cleanly), flushes the log handlers
    and standard streams, then leaves with ``os._exit`` instead of finalizing the
    interpreter.

    Finalizing tears down modules and thread states while the process's native threads
    (the tokio runtime's, XLA's thread pools, daemon threads still inside them) keep
    running, and they are never joined. A worker that had drained cleanly once died there
    of SIGSEGV, after its last log line: its launcher saw a crash (Slurm: ``task 2:
    Segmentation fault``) where it had stopped as asked. Nothing is left to finalize by
    then: the server drained and stopped, its metrics endpoint is closed.

    Example::

        status = serve(args)     # returns once the server stopped
        end_process(status)
    """
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            # Closed or broken: nothing more can be written.
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    finally:
        os._exit(status)


def start_metrics(
    args: argparse.Namespace, serve: Callable[[Any, str, int], Any], server: Any
) -> Any:
    """Starts the ``--metrics-port`` endpoint for ``server`` (``None`` without the flag)."""
    if args.metrics_port is None:
        return None
    if not 0 <= args.metrics_port <= 65535:
        raise TaskSetupError(f"--metrics-port {args.metrics_port} is not a TCP port (0-65535)")
    endpoint = serve(server, args.metrics_host, args.metrics_port)
    logging.getLogger("jaxcluster.metrics").info("serving Prometheus metrics at %s", endpoint.url)
    return endpoint


def watch_stdin(on_eof: Callable[[], None]) -> None:
    """Calls ``on_eof`` from a daemon thread once standard input closes (the parent died)."""

    def watch() -> None:
        # os.read on the descriptor, not sys.stdin.buffer: a daemon thread blocked in the
        # buffered reader aborts interpreter shutdown ("could not acquire lock").
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass
        on_eof()

    threading.Thread(target=watch, name="jaxcluster-stdin-watch", daemon=True).start()
