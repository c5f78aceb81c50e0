"""The `python -m jaxcluster.worker` process: flags, listening line, token file, SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from jaxcluster import wire
from jaxcluster._native import core
from jaxcluster.coordinator import functions
from jaxcluster.errors import UnauthenticatedError, UnavailableError
from support.workers import launch, running_worker, wait_until

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_prints_one_listening_line_with_the_port_actually_bound() -> None:
    with running_worker(["--address", "127.0.0.1:0"]) as worker:
        assert re.fullmatch(r"127\.0\.0\.1:\d+", worker.address)
        port = int(worker.address.rsplit(":", 1)[1])
        assert port > 0
        assert worker.client().get_status()["worker_index"] == 0
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.finish() == 0
        assert worker.lines == [f"jaxcluster worker listening on 127.0.0.1:{port}"]


def test_default_address_is_loopback_with_a_free_port() -> None:
    with running_worker([], token=None) as worker:
        assert worker.address.startswith("127.0.0.1:")
        assert not worker.address.endswith(":0")
        # No token configured on a loopback bind: requests without one are served.
        assert core.WorkerClient(worker.address).get_status()["state"] == "serving"


def test_the_token_file_is_read_with_surrounding_whitespace_ignored(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("\n  file-token-123 \t\n\n")
    args = ["--auth-token-file", str(token_file), "--index", "2"]
    # The environment token is ignored when a file is given.
    with running_worker(args, token="env-token") as worker:
        status = core.WorkerClient(worker.address, auth_token="file-token-123").get_status()
        assert status["worker_index"] == 2
        with pytest.raises(UnauthenticatedError):
            core.WorkerClient(worker.address, auth_token="env-token").get_status()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--auth-token-file", "{empty}"], "is empty"),
        (["--auth-token-file", "{missing}"], "cannot read --auth-token-file"),
        (["--index", "-1"], "--index -1 is negative"),
        (["--address", "not-an-address"], "not-an-address"),
        (["--max-message-bytes", "10"], "max_message_bytes=10"),
        (["--from-resolver", "no-such-environment"], "--from-resolver 'no-such-environment'"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    (tmp_path / "empty").write_text("  \n")
    filled = [a.format(empty=tmp_path / "empty", missing=tmp_path / "missing") for a in args]
    worker = launch(filled)
    assert worker.finish() == 2, worker.stderr
    assert expected in worker.stderr
    assert worker.lines == []


def test_sigterm_lets_the_inflight_closure_finish_then_exits_0(tmp_path: Path) -> None:
    fifo = tmp_path / "release"
    os.mkfifo(fifo)

    def wait_for_release(path: str) -> str:
        # Blocks in open() until the test opens the FIFO for writing.
        with open(path) as f:
            return "finished:" + f.read()

    with running_worker(["--index", "5"]) as worker:
        client = worker.client()
        payload = functions.pickle_function(wait_for_release)
        client.register_function(payload.function_hash, payload.kind, payload.payload)
        args = wire.encode(((str(fifo),), {}))
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["reply"] = client.run_closure(payload.function_hash, args.pickle)
            except Exception as exc:
                outcome["error"] = exc

        caller = threading.Thread(target=call)
        caller.start()
        wait_until(lambda: client.get_status()["inflight"] == 1, what="closure in flight")

        worker.popen.send_signal(signal.SIGTERM)
        # SIGTERM is a preemption notice too (Kubernetes): the worker drains, reporting it.
        wait_until(lambda: client.get_status()["state"] == "preempting", what="preempting")
        with pytest.raises(UnavailableError, match="shutting down"):
            client.run_closure(payload.function_hash, args.pickle)
        assert worker.popen.poll() is None  # still finishing the closure

        with open(fifo, "w") as f:
            f.write("ok")
        caller.join(timeout=60)
        assert "error" not in outcome, outcome.get("error")
        reply = outcome["reply"]
        assert wire.decode(reply["value"], reply["buffers"]) == "finished:ok"
        assert worker.finish() == 0


def test_python_dash_m_and_the_cli_module_share_flags() -> None:
    import argparse

    from jaxcluster.commands import worker as command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["--address", "127.0.0.1:0", "--index", "3"])
    assert (args.address, args.index, args.max_message_bytes) == ("127.0.0.1:0", 3, 64 << 20)
    assert callable(command.run)


def test_stdin_eof_stops_a_worker_that_asked_for_it() -> None:
    # What happens when a LocalCluster's process dies: the worker's stdin pipe closes.
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxcluster.worker", "--stop-on-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "JAXCLUSTER_AUTH_TOKEN"},
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().startswith("jaxcluster worker listening on ")
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0


def _double(n: int) -> int:
    return 2 * n


@pytest.mark.parametrize("stop", ["sigterm", "stdin-eof"])
def test_a_clean_stop_leaves_no_fatal_error_on_stderr(stop: str) -> None:
    # As LocalCluster runs its workers: stdin is a pipe the parent holds open, watched by a
    # thread. A thread blocked reading sys.stdin at interpreter shutdown used to abort the
    # worker with "Fatal Python error: _enter_buffered_busy".
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxcluster.worker", "--stop-on-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "JAXCLUSTER_AUTH_TOKEN"},
    )
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith("jaxcluster worker listening on "), line
        client = core.WorkerClient(line.split()[-1])
        payload = functions.pickle_function(_double)
        client.register_function(payload.function_hash, payload.kind, payload.payload)
        args = wire.encode(((21,), {}))
        reply = client.run_closure(payload.function_hash, args.pickle, args.buffers)
        assert wire.decode(reply["value"], reply["buffers"]) == 42
        if stop == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        stderr = proc.stderr.read()
        assert "Fatal Python error" not in stderr, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()


def test_a_notice_before_the_handlers_exist_is_held_and_delivered_to_them() -> None:
    """SIGTERM (or ``--preemption-signal``) arriving while the worker starts up — its
    server may already answer — reaches the drain/preemption handlers once they exist,
    instead of killing the worker with the default action."""
    import argparse
    import os
    import signal

    from jaxcluster.worker.main import _SignalsHeld

    before = {n: signal.getsignal(n) for n in (signal.SIGTERM, signal.SIGUSR1)}
    seen: list[int] = []
    try:
        held = _SignalsHeld(argparse.Namespace(preemption_signal="USR1"))
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == []  # held, not acted on
        signal.signal(signal.SIGTERM, lambda n, f: seen.append(n))  # the real handler
        held.deliver()
        # SIGTERM once, to the handler now installed; USR1 (never received) was taken
        # over by no handler: its default action is back.
        assert seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
