"""The `jaxcluster ps` process: flags as the worker's, one listening line, token file,
--from-resolver, loopback default, SIGTERM and stdin EOF -> exit 0."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from jaxcluster._native import core
from jaxcluster.errors import UnauthenticatedError

LISTENING = re.compile(r"^jaxcluster ps listening on (\S+)$")


class PsProc:
    def __init__(self, args: Sequence[str], env: dict[str, str], *, cli: bool) -> None:
        command = ["-m", "jaxcluster", "ps"] if cli else ["-m", "jaxcluster.ps"]
        self.popen = subprocess.Popen(
            [sys.executable, *command, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def listening(self) -> str:
        line = self.lines.get(timeout=120)
        match = LISTENING.match(line or "")
        assert match, f"expected the listening line, got {line!r}: {self.finish()}"
        return match.group(1)

    def finish(self, timeout: float = 60) -> str:
        """Waits for exit; returns stderr."""
        _, err = self.popen.communicate(timeout=timeout)
        return err


def environment(token: str | None, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("JAXCLUSTER_") and not k.startswith("TF_CONFIG")
    }
    env["PYTHONUNBUFFERED"] = "1"
    if token is not None:
        env["JAXCLUSTER_AUTH_TOKEN"] = token
    env.update(extra)
    return env


@contextmanager
def running(
    args: Sequence[str], token: str | None = "tok", *, cli: bool = False, **extra: str
) -> Iterator[PsProc]:
    proc = PsProc(args, environment(token, **extra), cli=cli)
    try:
        yield proc
    finally:
        if proc.popen.poll() is None:
            proc.popen.kill()
        proc.popen.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_one_listening_line_and_sigterm_exits_zero() -> None:
    with running(["--address", "127.0.0.1:0", "--index", "3"], cli=True) as ps:
        address = ps.listening()
        assert re.fullmatch(r"127\.0\.0\.1:[1-9]\d*", address)
        client = core.PsClient(address, auth_token="tok")
        assert client.get_status()["ps_index"] == 3
        client.create_variable("v", np.float32(1))
        ps.popen.send_signal(signal.SIGTERM)
        ps.finish()
        assert ps.popen.returncode == 0
        assert ps.lines.get(timeout=10) is None, "nothing after the listening line"


def test_default_is_loopback_and_stdin_eof_stops_it() -> None:
    with running(["--stop-on-stdin-eof"], token=None) as ps:
        address = ps.listening()
        assert address.startswith("127.0.0.1:") and not address.endswith(":0")
        assert core.PsClient(address).get_status()["variables"] == 0
        assert ps.popen.stdin is not None
        ps.popen.stdin.close()
        assert ps.popen.wait(timeout=60) == 0


def test_the_token_file_wins_over_the_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("\n  file-token \t\n")
    with running(["--auth-token-file", str(token_file)], token="env-token") as ps:
        address = ps.listening()
        assert core.PsClient(address, auth_token="file-token").get_status()["ps_index"] == 0
        for wrong in ("env-token", None):
            with pytest.raises(UnauthenticatedError):
                core.PsClient(address, auth_token=wrong).get_status()


@pytest.mark.parametrize(
    ("args", "token", "expected"),
    [
        (["--address", "0.0.0.0:0"], None, "refusing to bind"),
        (["--index", "-1"], "tok", "--index -1 is negative"),
        (["--auth-token-file", "/nonexistent/token"], "tok", "cannot read --auth-token-file"),
        (["--max-message-bytes", "5"], "tok", "max_message_bytes=5"),
    ],
)
def test_bad_settings_exit_2_with_a_reason(
    args: list[str], token: str | None, expected: str
) -> None:
    with running(args, token=token) as ps:
        err = ps.finish()
        assert ps.popen.returncode == 2
        assert expected in err and err.startswith("jaxcluster ps: error:"), err


def test_from_resolver_takes_index_and_port_from_the_cluster() -> None:
    ports = [free_port(), free_port()]
    cluster = {
        "JAXCLUSTER_WORKERS": "127.0.0.1:1",
        "JAXCLUSTER_PS": ",".join(f"127.0.0.1:{p}" for p in ports),
        "JAXCLUSTER_TASK_TYPE": "ps",
        "JAXCLUSTER_TASK_ID": "1",
    }
    with running(["--from-resolver", "explicit"], **cluster) as ps:
        address = ps.listening()
        assert address == f"127.0.0.1:{ports[1]}"  # the host the cluster spec advertises
        status = core.PsClient(f"127.0.0.1:{ports[1]}", auth_token="tok").get_status()
        assert status["ps_index"] == 1


def test_from_resolver_tasks_on_one_machine_share_a_port_under_distinct_hosts() -> None:
    # Two "nodes" of one machine (127.0.0.2 and 127.0.0.3), one port: each task binds the
    # host its cluster spec advertises, so neither takes the other's address.
    port = free_port()
    cluster = {
        "JAXCLUSTER_WORKERS": "127.0.0.1:1",
        "JAXCLUSTER_PS": f"127.0.0.2:{port},127.0.0.3:{port}",
        "JAXCLUSTER_TASK_TYPE": "ps",
    }
    with (
        running(["--from-resolver", "explicit"], **cluster, JAXCLUSTER_TASK_ID="0") as first,
        running(["--from-resolver", "explicit"], **cluster, JAXCLUSTER_TASK_ID="1") as second,
    ):
        assert first.listening() == f"127.0.0.2:{port}"
        assert second.listening() == f"127.0.0.3:{port}"
        for index, host in enumerate(("127.0.0.2", "127.0.0.3")):
            status = core.PsClient(f"{host}:{port}", auth_token="tok").get_status()
            assert status["ps_index"] == index


def test_from_resolver_refuses_a_task_of_another_job() -> None:
    cluster = {
        "JAXCLUSTER_WORKERS": "127.0.0.1:1",
        "JAXCLUSTER_PS": "127.0.0.1:2",
        "JAXCLUSTER_TASK_TYPE": "worker",
        "JAXCLUSTER_TASK_ID": "0",
    }
    with running(["--from-resolver", "explicit"], **cluster) as ps:
        err = ps.finish()
        assert ps.popen.returncode == 2
        assert "task 0 of job 'worker', not of job 'ps'" in err, err
