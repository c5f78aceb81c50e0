"""``jaxcluster status``: a table of every worker's and ps task's state from real
processes, found by address or through a resolver, with the token from a file or the
environment; unreachable tasks and wrong tokens say so; ``--watch`` refreshes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jaxcluster
from jaxcluster import LocalCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with LocalCluster(2, num_ps=1) as c:
        yield c


def _status(*args: str, token: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JAXCLUSTER_")}
    if token is not None:
        environ["JAXCLUSTER_AUTH_TOKEN"] = token
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "jaxcluster", "status", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )


def _rows(table: str) -> dict[str, dict[str, str]]:
    """``{task: {column: cell}}`` from the table, cutting columns at the header's starts."""
    header, *lines = table.strip().splitlines()
    names = ["TASK", "ADDRESS", "STATE", "RUN", "FAILED", "UPTIME", "VERSION", "LAST ERROR"]
    starts = [header.index(name) for name in names]
    rows = {}
    for line in lines:
        cells = [
            line[start : (starts[i + 1] if i + 1 < len(starts) else None)].strip()
            for i, start in enumerate(starts)
        ]
        rows[cells[0]] = dict(zip(names, cells, strict=True))
    return rows


def test_the_table_shows_each_task_by_address(cluster: Any, tmp_path: Path) -> None:
    with cluster.coordinator() as coordinator:
        coordinator.fetch([coordinator.schedule(lambda: 1) for _ in range(10)])
    token_file = tmp_path / "token"
    token_file.write_text(f"  {cluster.auth_token}\n")
    addresses = [*cluster.addresses, *cluster.ps_addresses]
    done = _status(*addresses, "--auth-token-file", str(token_file))
    assert done.returncode == 0, done.stdout + done.stderr
    # By address the job is found out; the task index is not known.
    lines = done.stdout.strip().splitlines()[1:]
    assert len(lines) == 3
    by_address = {line.split()[1]: line.split() for line in lines}
    for address in cluster.addresses:
        task, _, state, _run, failed, uptime, version = by_address[address][:7]
        assert (task, state, failed) == ("worker", "serving", "0")
        assert version == jaxcluster.__version__
        assert uptime.count(":") == 2
    assert sum(int(by_address[a][3]) for a in cluster.addresses) >= 10
    ps = by_address[cluster.ps_addresses[0]]
    assert ps[:5] == ["ps", cluster.ps_addresses[0], "serving", "-", "-"]


def test_a_resolver_names_every_task_and_json_is_for_scripts(cluster: Any) -> None:
    tf_config = json.dumps(
        {
            "cluster": {"worker": cluster.addresses, "ps": cluster.ps_addresses},
            "task": {"type": "worker", "index": 0},
        }
    )
    done = _status(
        "--resolver", "tf_config", "--format", "json", token=cluster.auth_token, TF_CONFIG=tf_config
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["task"] for r in rows] == ["worker/0", "worker/1", "ps/0"]
    assert all(r["serving"] and r["state"] == "serving" for r in rows)
    assert [r["details"]["worker_index"] for r in rows[:2]] == [0, 1]
    assert rows[2]["details"]["ps_index"] == 0
    table = _status("--resolver", "tf_config", token=cluster.auth_token, TF_CONFIG=tf_config)
    assert set(_rows(table.stdout)) == {"worker/0", "worker/1", "ps/0"}


def test_unreachable_and_unauthenticated_tasks_say_why_and_fail_the_check(cluster: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"
    done = _status(cluster.addresses[0], nobody, token=cluster.auth_token)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = {line.split()[1]: line for line in done.stdout.strip().splitlines()[1:]}
    assert " serving " in lines[cluster.addresses[0]]
    assert " unreachable " in lines[nobody] and "Connection refused" in lines[nobody]
    wrong = _status(cluster.addresses[0], token="not-the-token")
    assert wrong.returncode == 1
    assert " unauthenticated " in wrong.stdout and "token" in wrong.stdout


def test_a_task_s_last_closure_error_is_shown(cluster: Any) -> None:
    def fails() -> None:
        raise KeyError("missing-row-17")

    with cluster.coordinator(error_policy="per_closure") as coordinator:
        value = coordinator.schedule(fails)
        with pytest.raises(KeyError):
            value.fetch(timeout=120)
    done = _status(*cluster.addresses, "--format", "json", token=cluster.auth_token)
    errors = [r["last_error"] for r in json.loads(done.stdout) if r["last_error"]]
    assert errors == ["KeyError: 'missing-row-17'"], done.stdout


WATCH = ("--watch", "--interval", "0.2")


def test_watch_refreshes_until_interrupted(cluster: Any) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JAXCLUSTER_")}
    environ.update({"JAXCLUSTER_AUTH_TOKEN": cluster.auth_token, "PYTHONUNBUFFERED": "1"})
    watch = subprocess.Popen(
        [sys.executable, "-m", "jaxcluster", "status", cluster.addresses[0], *WATCH],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )
    assert watch.stdout is not None
    headers = 0
    try:
        for line in watch.stdout:
            headers += line.startswith("TASK")
            if headers == 3:
                break
    finally:
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=60)
    assert headers == 3
    assert watch.returncode == 0, err


def test_no_task_named_is_an_error() -> None:
    done = _status()
    assert done.returncode == 2
    assert "ADDRESS" in done.stderr and "--resolver" in done.stderr
