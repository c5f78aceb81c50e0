"""``jaxcluster worker`` / ``python -m jaxcluster.worker``: serve closures to a coordinator.

Prints exactly one line, ``jaxcluster worker listening on HOST:PORT``, once it accepts
requests. SIGTERM (or a first Ctrl-C) stops it taking closures, lets the running one
finish, and exits with status 0; SIGTERM and the other preemption notices
(:mod:`jaxcluster.worker.preemption`) also make it report state ``preempting``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from jaxcluster._task_process import (
    PREVIOUS_EXIT_ENV,
    TaskSetupError,
    add_task_arguments,
    configure_logging,
    describe_exit,
    end_process,
    limit_settings,
    preempted_line,
    start_metrics,
    task_settings,
    tls_error,
    tls_files,
)
from jaxcluster.errors import DeadlineExceededError
from jaxcluster.worker.preemption import (
    PreemptionWatch,
    add_preemption_arguments,
    signal_number,
)
from jaxcluster.worker.slice import SLICE_BROKEN_EXIT, SliceMismatchError
from jaxcluster.worker.slice_flags import (
    add_slice_arguments,
    explicit_flags,
    peer_tls_ca,
    slice_config,
    slice_status,
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
    add_slice_arguments(parser)
    add_preemption_arguments(parser)


def _install_signal_handlers(server: Any) -> None:
    def drain(signum: int, frame: FrameType | None) -> None:
        already = not server.begin_shutdown()
        if signum == signal.SIGINT and already:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)


class _SignalsHeld:
    """SIGTERM (and ``--preemption-signal``) received while the worker starts up, before
    its drain and preemption handlers exist: recorded, then raised again once they do
    (:meth:`deliver`). Without this, a notice sent as soon as the worker answers — a
    coordinator may see it serving before its handlers are installed — killed it at once
    with the default action, losing the running closure's answer and the notice."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._received: list[int] = []
        self._numbers = {int(signal.SIGTERM)}
        if args.preemption_signal:
            self._numbers.add(signal_number(args.preemption_signal))
        for number in self._numbers:
            signal.signal(number, self._hold)

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._received.append(signum)

    def deliver(self) -> None:
        """Raises each held signal again, now that the real handlers are installed."""
        for number in self._numbers:  # no handler took it over: its default action again
            if signal.getsignal(number) == self._hold:
                signal.signal(number, signal.SIG_DFL)
        received, self._received = self._received, []
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)


def run(args: argparse.Namespace) -> int:
    """Runs a worker with parsed ``args`` until it is shut down; returns the exit status.
    A host of a multi-host slice runs as the supervisor of its serving process (see
    :mod:`jaxcluster.worker.supervisor`) unless ``--no-restart``."""
    raw = getattr(args, "raw_argv", None)
    if raw is None or args.supervised or args.no_restart:
        return _serve(args)
    try:
        forwarded = [signal_number(args.preemption_signal)] if args.preemption_signal else []
    except ValueError as exc:
        print(f"jaxcluster worker: error: {exc}", file=sys.stderr, flush=True)
        return 2
    if (args.slice_size or 1) > 1:
        from jaxcluster.worker.supervisor import supervise

        return supervise(raw, dict(os.environ), forwarded)
    if args.slice_size is None and args.from_resolver is not None:
        # Whether this host is part of a slice depends on what the resolver says: ask
        # once, here, and give the supervised process the answer as flags.
        try:
            settings = task_settings(args, job="worker", prog="jaxcluster worker")
            config = slice_config(args, settings[2])
        except (TaskSetupError, ValueError, OSError) as exc:
            print(f"jaxcluster worker: error: {exc}", file=sys.stderr, flush=True)
            return 2
        if config is not None:
            from jaxcluster.worker.supervisor import supervise

            return supervise([*raw, *explicit_flags(config)], dict(os.environ), forwarded)
        # Not part of a slice: serve with what was just resolved rather than ask again.
        return _serve(args, resolved=(settings, None))
    return _serve(args)


def _serve(
    args: argparse.Namespace, resolved: tuple[tuple[Any, str, int], Any] | None = None
) -> int:
    """Serves until shut down. ``resolved``: ``task_settings``' and ``slice_config``'s
    answers when the caller has them already (asking the resolver again would cost another
    round trip to its API, and could answer differently)."""
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
        if args.preemption_signal:
            signal_number(args.preemption_signal)  # refused here, before serving
        # The server answers as soon as it is made, before its handlers are installed:
        # a notice arriving in between is held and delivered to them, never lost.
        held = _SignalsHeld(args)
        if resolved is None:
            token, address, index = task_settings(args, job="worker", prog="jaxcluster worker")
            config = slice_config(args, index)
        else:
            (token, address, index), config = resolved
        # Closures reach parameter servers with the token this worker was started with.
        context.set_worker_auth_token(token)
        tls_cert, tls_key = tls_files(args)
        peer_ca = peer_tls_ca(tls_cert) if config is not None else None
        dataflow_ca, peer_unreachable = _dataflow_tls(tls_cert, peer_ca)
        if config is not None:
            from jaxcluster.worker.slice import join

            join(config)  # before JAX's backend starts: it must see the whole slice
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
            state_ttl=args.state_ttl,
            peer_tls_ca=dataflow_ca,
            **slice_status(config),
            **limit_settings(args),
            **info,
        )
        metrics = start_metrics(args, serve_worker, server)
    except (TaskSetupError, ValueError, OSError, MissingMetricsExtraError) as exc:
        print(f"jaxcluster worker: error: {tls_error(exc, args)}", file=sys.stderr, flush=True)
        return 2
    except DeadlineExceededError as exc:  # the slice did not form: worth starting again
        print(f"jaxcluster worker: error: {exc}", file=sys.stderr, flush=True)
        return 3
    peer_notice = threading.Event()  # rank 0 drains for a peer's preemption notice
    try:
        slice_parts = (
            _form_slice(config, server, token, peer_ca, peer_notice) if config is not None else None
        )
    except SliceMismatchError as exc:
        print(f"jaxcluster worker: error: {exc}", file=sys.stderr, flush=True)
        server.shutdown(timeout=1.0)
        return 2

    _install_signal_handlers(server)
    preemption = PreemptionWatch(server, args)
    preemption.start()
    held.deliver()
    watch = ParentWatch(server) if args.stop_on_stdin_eof else None
    if watch is not None:
        watch.start()
    try:
        print(f"jaxcluster worker listening on {server.address}", flush=True)
        if slice_parts is None or config is None:
            executor = Executor(server, index, peer_unreachable=peer_unreachable)
        else:
            fanout, slice_watch = slice_parts
            # In a slice the closures' worker index is the slice's (one per slice).
            executor = Executor(
                server,
                config.index,
                sliced=True,
                fanout=fanout,
                slice_check=slice_watch.check,
                peer_unreachable=peer_unreachable,
            )
        executor.serve()
        # Kept values are still read by peers while the last answers are acknowledged.
        drained = server.shutdown(timeout=30.0)
        executor.close()
        status = server.status()
        _log.info(
            "worker %d stopped%s after %d closures (%d failed)",
            index,
            "" if drained else " without draining in 30 s",
            status["closures_run"],
            status["closures_failed"],
        )
    finally:
        preemption.stop()
        if slice_parts is not None:
            slice_parts[1].stop()
        if metrics is not None:
            metrics.close()
        # Joined before the interpreter finalizes: no thread of ours is left inside I/O.
        if watch is not None:
            watch.stop()
    source = server.status().preemption_source
    if source is not None and not peer_notice.is_set():
        # For its launcher (stdout has the listening line only): the next process
        # reports this end (PREEMPTED_EXIT).
        print(preempted_line(source), file=sys.stderr, flush=True)
    # Drained for a peer's notice: this host is not preempted, its supervisor starts it
    # again for the slice to re-form with the peer's replacement. Ended here, not by
    # finalizing the interpreter under the runtime's live threads (end_process).
    end_process(SLICE_BROKEN_EXIT if peer_notice.is_set() else 0)


def _dataflow_tls(
    tls_cert: bytes | None, slice_ca: bytes | None
) -> tuple[bytes | None, str | None]:
    """The CA this worker verifies peers with when it pulls kept values from them, and,
    when it cannot pull, why: a worker serving TLS never dials a peer in plaintext (its
    token would travel in clear), so without ``JAXCLUSTER_TLS_CA`` its pulls fail."""
    if tls_cert is None:
        return None, None
    from jaxcluster._tls import TLS_CA_ENV, ca_from_env

    ca = slice_ca if slice_ca is not None else ca_from_env()
    if ca is None:
        return None, (
            f"this worker serves TLS (--tls-cert) but has no CA to verify other workers "
            f"with: set {TLS_CA_ENV} (path or PEM) where it starts to let it pull kept values "
            "from them"
        )
    return ca, None


def _slice_notice(server: Any, index: int, noticed: threading.Event) -> Callable[[Any, Any], None]:
    """Rank 0's ``SliceWatch.on_notice``: a peer's preemption notice is the slice's (a
    slice is preempted as a unit), so rank 0 announces it to the coordinators with the
    peer's source and deadline: they stop sending work, count the preemption and save
    ``on_preemption="save"`` state (forwarded to every host, the preempted one included).
    Rank 0 then drains and exits with ``SLICE_BROKEN_EXIT``, so its supervisor starts it
    again for the slice to re-form with the peer's replacement."""

    def on_notice(host: Any, status: Any) -> None:
        detail = f"rank {host.rank} of slice {index} at {host.address}: "
        detail += status.preemption_detail or status.preemption_source
        if server.preempt(status.preemption_source, status.preemption_deadline or 0.0, detail):
            noticed.set()

    return on_notice


def _form_slice(
    config: Any, server: Any, token: str | None, tls_ca: bytes | None, peer_notice: threading.Event
) -> tuple[Any, Any]:
    """Exchanges addresses with the slice's other hosts and starts watching them: rank 0
    watches every peer and forwards jobs to them (its ``Fanout``), a peer watches rank 0.
    Returns ``(fanout or None, watch)``; rank 0 sets ``peer_notice`` when it drains for a
    peer's preemption notice (:func:`_slice_notice`)."""
    from jaxcluster._auth import warn_if_token_in_clear
    from jaxcluster.worker.fanout import Fanout
    from jaxcluster.worker.slice import SliceWatch, exchange

    hosts = exchange(config, server.address, server.status()["incarnation"])
    peers = [h for h in hosts if h.rank != config.rank]
    watched = peers if config.leader else [hosts[0]]
    warn_if_token_in_clear(
        [h.address for h in peers], token, tls_ca, _log, "the slice's other hosts"
    )
    watch = SliceWatch(
        watched,
        token,
        config.heartbeat_timeout,
        slice_index=config.index,
        on_notice=_slice_notice(server, config.index, peer_notice) if config.leader else None,
        tls_ca=tls_ca,
    )
    watch.start()
    fanout = None
    if config.leader:
        fanout = Fanout(
            peers,
            token,
            slice_index=config.index,
            heartbeat_timeout=config.heartbeat_timeout,
            tls_ca=tls_ca,
        )
    _log.info(
        "slice %d formed: %s",
        config.index,
        ", ".join(f"rank {h.rank} {h.address}" for h in hosts),
    )
    return fanout, watch


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m jaxcluster.worker``."""
    parser = argparse.ArgumentParser(
        prog="jaxcluster worker", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.raw_argv = list(sys.argv[1:] if argv is None else argv)
    return run(args)
