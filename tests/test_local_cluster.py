"""LocalCluster: real worker processes that start, die, come back, and never linger."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from jaxcluster._native import core
from jaxcluster.errors import UnauthenticatedError, UnavailableError
from jaxcluster.local_cluster import LocalCluster
from support.workers import pid_gone, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_workers=2) as c:
        yield c


def client(cluster: LocalCluster, index: int) -> Any:
    return core.WorkerClient(cluster.addresses[index], auth_token=cluster.auth_token)


def test_workers_answer_on_distinct_loopback_addresses(cluster: LocalCluster) -> None:
    addresses = cluster.addresses
    assert len(set(addresses)) == 2
    assert all(a.startswith("127.0.0.1:") and not a.endswith(":0") for a in addresses)
    for i in range(2):
        assert client(cluster, i).get_status()["worker_index"] == i
    assert len(cluster.auth_token) >= 32
    with pytest.raises(UnauthenticatedError):
        core.WorkerClient(addresses[0]).get_status()


def test_the_token_is_not_on_any_command_line(cluster: LocalCluster) -> None:
    for i in range(2):
        pid = cluster.worker_pid(i)
        assert pid is not None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert cluster.auth_token.encode() not in f.read()


def test_kill_then_restart_on_the_same_address(cluster: LocalCluster) -> None:
    address = cluster.addresses[1]
    old_pid = cluster.worker_pid(1)
    assert old_pid is not None
    cluster.kill_worker(1)
    assert cluster.worker_pid(1) is None
    assert pid_gone(old_pid)
    with pytest.raises(UnavailableError):
        client(cluster, 1).get_status(timeout=10)
    assert client(cluster, 0).get_status()["state"] == "serving"  # the other is unaffected

    cluster.restart_worker(1)
    assert cluster.addresses[1] == address
    new_pid = cluster.worker_pid(1)
    assert new_pid is not None and new_pid != old_pid
    status = client(cluster, 1).get_status()
    assert status["worker_index"] == 1 and status["pid"] == new_pid


def test_restart_of_a_live_worker_replaces_it(cluster: LocalCluster) -> None:
    old_pid = cluster.worker_pid(0)
    cluster.restart_worker(0)
    assert old_pid is not None and pid_gone(old_pid)
    assert client(cluster, 0).get_status()["pid"] == cluster.worker_pid(0)


def test_resolver_lists_the_worker_job(cluster: LocalCluster) -> None:
    pytest.importorskip("jaxcluster.cluster_spec")
    pytest.importorskip("jaxcluster.cluster_resolver.simple")
    spec = cluster.resolver.cluster_spec()
    assert spec.as_dict() == {"worker": cluster.addresses}


def test_stop_leaves_no_process_behind() -> None:
    c = LocalCluster(num_workers=2)
    pids = [c.worker_pid(i) for i in range(2)]
    assert all(p is not None for p in pids)
    c.stop()
    c.stop()  # idempotent
    assert all(pid_gone(p) for p in pids if p is not None)
    with pytest.raises(RuntimeError, match="stopped"):
        c.kill_worker(0)


def test_a_parent_killed_with_sigkill_takes_its_workers_along() -> None:
    script = textwrap.dedent(
        """
        import json, sys
        from jaxcluster.local_cluster import LocalCluster
        c = LocalCluster(num_workers=2)
        print(json.dumps([c.worker_pid(i) for i in range(2)]), flush=True)
        sys.stdin.read()  # hold until killed
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    while not line.startswith("["):  # skip forwarded worker output
        assert line, "the parent exited before printing its workers' pids"
        line = parent.stdout.readline()
    pids = json.loads(line)
    parent.kill()
    parent.wait()
    wait_until(lambda: all(pid_gone(p) for p in pids), timeout=60, what="orphaned workers to exit")


def test_bad_arguments_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="num_workers=0"):
        LocalCluster(num_workers=0)
    with pytest.raises(ValueError, match="num_ps=-1"):
        LocalCluster(num_workers=1, num_ps=-1)
    with pytest.raises(TypeError, match="worker_args"):
        LocalCluster(num_workers=1, worker_args="--index 3")


def test_a_worker_that_cannot_start_is_reported_with_its_output() -> None:
    with pytest.raises(RuntimeError, match=r"exited with status 2[\s\S]*max_message_bytes=5"):
        LocalCluster(num_workers=1, worker_args=["--max-message-bytes", "5"])


def test_index_out_of_range(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match="out of range"):
        cluster.kill_worker(2)
