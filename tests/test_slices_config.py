"""Slice configuration without processes: grouping worker tasks into slices, the worker's
slice flags (given or derived from a resolver), and what LocalCluster accepts."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import pytest

from jaxcluster import LocalCluster
from jaxcluster._task_process import TaskSetupError
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.coordinator.slices import group_slices, slices_argument, slices_to_add
from jaxcluster.worker import main as worker_main
from jaxcluster.worker import slice_flags
from jaxcluster.worker.slice import SliceConfig, SliceHost, gather_output
from jaxcluster.worker.supervisor import _with_address

HOSTS = [f"10.0.0.{i}:8470" for i in range(6)]


def test_consecutive_tasks_form_a_slice() -> None:
    assert group_slices(HOSTS, 2) == [HOSTS[0:2], HOSTS[2:4], HOSTS[4:6]]
    assert group_slices(HOSTS, 3) == [HOSTS[0:3], HOSTS[3:6]]
    assert group_slices(HOSTS) == [[h] for h in HOSTS]  # the plain coordinator


def test_a_resolver_that_knows_its_slices_is_asked() -> None:
    class Resolver:
        def slices(self) -> list[list[str]]:
            return [HOSTS[:4], HOSTS[4:]]

    assert group_slices(HOSTS, resolver=Resolver()) == [HOSTS[:4], HOSTS[4:]]
    assert group_slices(HOSTS, 3, resolver=Resolver()) == [HOSTS[:3], HOSTS[3:]]  # K wins


def test_a_task_count_that_does_not_divide_is_refused() -> None:
    with pytest.raises(ValueError, match=r"6 worker tasks, not a multiple of hosts_per_slice=4"):
        group_slices(HOSTS, 4)
    with pytest.raises(ValueError, match="at least 1"):
        group_slices(HOSTS, 0)
    with pytest.raises(TypeError, match="expected an int"):
        group_slices(HOSTS, 2.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("slices", "message"),
    [
        ([], "non-empty list of slices"),
        ("h:1", "non-empty list of slices"),
        ([[]], r"slices\[0\]=\[\]"),
        ([["h:1"], "h:2"], r"slices\[1\]='h:2'"),
        ([["h:1", "nohost"]], "holds 'nohost'"),
        ([["h:1"], ["h:1"]], "h:1 appears in more than one place"),
    ],
)
def test_bad_explicit_slices_are_refused(slices: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        slices_argument(slices)


def test_coordinator_refuses_what_slices_cannot_do() -> None:
    with pytest.raises(ValueError, match="not a multiple of hosts_per_slice=4"):
        ClusterCoordinator(
            slices=None, strategy=None, cluster_resolver=_resolver(HOSTS), hosts_per_slice=4
        )
    with pytest.raises(ValueError, match=r"slices of \[2\] hosts but hosts_per_slice=3"):
        ClusterCoordinator(slices=[HOSTS[:2], HOSTS[2:4]], hosts_per_slice=3)


def test_a_sliced_coordinator_talks_to_rank_zero_and_changes_whole_slices() -> None:
    with ClusterCoordinator(_resolver(HOSTS), hosts_per_slice=3, connect_timeout=1.0) as c:
        assert c.slices == [HOSTS[:3], HOSTS[3:]]
        assert [w["address"] for w in c.workers] == [HOSTS[0], HOSTS[3]]
        extra = [f"10.0.1.{i}:8470" for i in range(7)]
        with pytest.raises(
            ValueError,
            match=r"2 addresses are not whole slices of hosts_per_slice=3 hosts "
            r"\(10\.0\.1\.0:8470, 10\.0\.1\.1:8470 would be part of a slice\)",
        ):
            c.add_workers(extra[:2])
        with pytest.raises(ValueError, match="has 2 hosts, but this coordinator's slices have"):
            c.add_workers([extra[:2]])
        with pytest.raises(ValueError, match="already serve this coordinator as a host"):
            c.add_workers([extra[0], extra[1], HOSTS[4]])
        assert len(c.workers) == 2  # nothing was added
        # A flat list of whole slices (each 3 in a row), or a list of slices.
        assert c.add_workers(extra[:6]) == [2, 3]
        assert c.add_workers([[extra[6], "10.0.2.1:8470", "10.0.2.2:8470"]]) == [4]
        assert [w["address"] for w in c.workers] == [
            HOSTS[0],
            HOSTS[3],
            extra[0],
            extra[3],
            extra[6],
        ]
        assert c.slices[3] == extra[3:6]
        # Naming any host of a slice removes the whole slice.
        c.remove_workers(HOSTS[4])
        assert c.workers[1].state == "removed"
        with pytest.raises(ValueError, match="no worker of this coordinator is at"):
            c.remove_workers(HOSTS[5])  # its slice has left already
        assert c.slices[1] == HOSTS[3:]
        # It joins again whole, under a new index.
        assert c.add_workers(HOSTS[3:]) == [5]
        assert c.slices[5] == HOSTS[3:]


def _resolver(hosts: list[str]) -> object:
    from jaxcluster.cluster_resolver import SimpleClusterResolver
    from jaxcluster.cluster_spec import ClusterSpec

    return SimpleClusterResolver(ClusterSpec({"worker": hosts}))


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    worker_main.add_arguments(parser)
    return parser.parse_args(argv)


def test_a_refresh_changes_whole_slices_and_ignores_a_partial_list(tmp_path: Path) -> None:
    from jaxcluster.cluster_resolver import TFConfigClusterResolver

    config = tmp_path / "tf_config.json"

    def write(hosts: list[str]) -> None:
        config.write_text(json.dumps({"cluster": {"worker": hosts}}))

    more = [f"10.0.1.{i}:8470" for i in range(3)]
    write(HOSTS[:3])
    resolver = TFConfigClusterResolver(tf_config_file=config)
    # A period that never comes: each refresh below is run by hand.
    with ClusterCoordinator(
        resolver, hosts_per_slice=3, connect_timeout=1.0, refresh_interval=3600.0
    ) as c:
        refresher = c._refresher
        assert refresher is not None
        write(HOSTS + more[:2])  # a slice and two hosts of the next
        with pytest.raises(ValueError, match="not a multiple of hosts_per_slice=3"):
            refresher.refresh()
        assert c.slices == [HOSTS[:3]]  # nothing changed: half a slice is never added
        write(HOSTS + more)
        refresher.refresh()
        assert c.slices == [HOSTS[:3], HOSTS[3:], more]
        write(HOSTS[:3] + more)  # the second slice's hosts are gone
        refresher.refresh()
        assert [w.state == "removed" for w in c.workers] == [False, True, False]


def test_slices_to_add_takes_whole_slices_only() -> None:
    assert slices_to_add(HOSTS[:4], 2) == [HOSTS[:2], HOSTS[2:4]]
    assert slices_to_add([HOSTS[:3], HOSTS[3:]], None) == [HOSTS[:3], HOSTS[3:]]
    assert slices_to_add([], 2) == []
    with pytest.raises(ValueError, match="slices differ in size"):
        slices_to_add(HOSTS[:2], None)
    with pytest.raises(ValueError, match="expected a multiple of 2 addresses"):
        slices_to_add(HOSTS[:3], 2)
    with pytest.raises(ValueError, match=r"add_workers\(\): .* appears in more than one place"):
        slices_to_add([HOSTS[:2], HOSTS[1:3]], 2)


def test_slice_flags_default_from_the_task_index() -> None:
    config = slice_flags.slice_config(
        _args("--slice-size", "2", "--slice-coordinator", "10.0.0.2:8476"), 3
    )
    assert config == SliceConfig(index=1, rank=1, size=2, coordinator="10.0.0.2:8476")
    assert slice_flags.slice_config(_args(), 3) is None
    assert slice_flags.slice_config(_args("--slice-size", "1"), 3) is None


def test_slice_flags_from_a_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = {"cluster": {"worker": HOSTS[:4]}, "task": {"type": "worker", "index": 3}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(spec))
    args = _args("--from-resolver", "tf_config", "--slice-size", "2")
    config = slice_flags.slice_config(args, 3)
    # Slice 1 is tasks 2 and 3: its coordinator is task 2's host on JAX's usual port.
    assert config == SliceConfig(index=1, rank=1, size=2, coordinator="10.0.0.2:8476")


def test_a_worker_outside_any_slice_asks_its_resolver_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = {"cluster": {"worker": HOSTS[:2]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(spec))
    asked: list[int] = []
    real = worker_main.task_settings

    def counting(*args: object, **kwargs: object) -> object:
        asked.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    served: list[object] = []
    monkeypatch.setattr(worker_main, "task_settings", counting)
    monkeypatch.setattr(worker_main, "_serve", lambda args, resolved=None: served.append(resolved))
    args = _args("--from-resolver", "tf_config")
    args.raw_argv = ["--from-resolver", "tf_config"]
    worker_main.run(args)
    # Not a slice (TF_CONFIG knows none): served with the answer already in hand.
    assert len(asked) == 1
    assert served == [((None, HOSTS[1], 1), None)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--slice-size", "2"), "needs --slice-coordinator HOST:PORT"),
        (("--slice-index", "1"), "need --slice-size K"),
        (("--slice-size", "2", "--slice-rank", "2", "--slice-coordinator", "h:1"), "rank 2"),
        (("--slice-size", "2", "--slice-coordinator", "nohostport"), "expected HOST:PORT"),
        (("--slice-size", "0"), "expected at least 1"),
    ],
)
def test_bad_slice_flags_say_what_is_wrong(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(TaskSetupError, match=message):
        slice_flags.slice_config(_args(*argv), 0)


def test_a_restarted_host_keeps_its_address() -> None:
    assert _with_address(["--index", "1", "--address", "127.0.0.1:0", "--x"], "127.0.0.1:5") == [
        "--index",
        "1",
        "--x",
        "--address",
        "127.0.0.1:5",
    ]
    assert _with_address(["--address=h:0"], "h:7") == ["--address", "h:7"]


def test_a_host_describes_itself_for_mismatch_errors() -> None:
    host = SliceHost(rank=1, index=0, size=2, address="h:1", incarnation=5, hostname="n1", pid=9)
    assert host.describe() == "rank 1 at h:1 (n1, pid 9) says slice 0 of 2 hosts"


def test_outputs_that_are_local_pass_unchanged() -> None:
    import jax.numpy as jnp
    import numpy as np

    tree = {"a": jnp.arange(3), "b": np.ones(2), "c": "text"}
    out = gather_output(tree)
    assert out["c"] == "text" and out["b"] is tree["b"] and out["a"] is tree["a"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 3, "hosts_per_slice": 2}, "not a multiple of hosts_per_slice=2"),
        ({"num_workers": 2, "hosts_per_slice": 0}, "hosts_per_slice=0"),
        ({"num_workers": 2, "devices_per_host": 0}, "devices_per_host=0"),
    ],
)
def test_local_cluster_refuses_impossible_slices(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LocalCluster(**kwargs)  # type: ignore[arg-type]


def test_each_tpu_is_one_slice_and_a_union_of_tpus_is_several() -> None:
    from jaxcluster.cluster_resolver import (
        SimpleClusterResolver,
        TPUClusterResolver,
        UnionClusterResolver,
    )
    from jaxcluster.cluster_spec import ClusterSpec

    a = TPUClusterResolver("grpc://10.0.0.1,10.0.0.2")
    b = TPUClusterResolver("grpc://10.0.1.1,10.0.1.2")
    assert a.slices() == [["10.0.0.1:8470", "10.0.0.2:8470"]]
    union = UnionClusterResolver(a, b)
    assert union.slices() == [a.slices()[0], b.slices()[0]]
    with ClusterCoordinator(union, connect_timeout=1.0) as coordinator:  # no K given
        assert coordinator.slices == union.slices()
        assert [w["address"] for w in coordinator.workers] == ["10.0.0.1:8470", "10.0.1.1:8470"]
    # A member that does not know its slices leaves the grouping to hosts_per_slice.
    plain = SimpleClusterResolver(ClusterSpec({"worker": ["10.0.2.1:8470"]}))
    assert UnionClusterResolver(a, plain).slices() is None
    ps_only = SimpleClusterResolver(ClusterSpec({"ps": ["10.0.3.1:8470"]}))
    assert UnionClusterResolver(a, ps_only).slices() == a.slices()


def test_a_resolver_that_knows_its_slices_places_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import jaxcluster.cluster_resolver as cluster_resolver

    class TpuLike:
        def __init__(self, groups: list[list[str]]) -> None:
            self.groups = groups

        def slices(self) -> list[list[str]]:
            return self.groups

    two = TpuLike([HOSTS[:2], HOSTS[2:4]])
    monkeypatch.setattr(cluster_resolver, "resolve", lambda environment: two)
    args = _args("--from-resolver", "gce_tpu_vm")
    config = slice_flags.slice_config(args, 3)
    assert config == SliceConfig(index=1, rank=1, size=2, coordinator="10.0.0.2:8476")
    # The supervisor hands its child the answer as flags: the same config, no resolving.
    assert config is not None
    again = slice_flags.slice_config(_args(*slice_flags.explicit_flags(config)), 0)
    assert again == config
    singles = TpuLike([[h] for h in HOSTS])
    monkeypatch.setattr(cluster_resolver, "resolve", lambda environment: singles)
    assert slice_flags.slice_config(args, 3) is None  # one host per slice: a plain worker
    assert slice_flags.slice_status(None) == {}
    assert slice_flags.slice_status(config) == {"slice_index": 1, "slice_rank": 1, "slice_size": 2}


def test_a_supervised_host_dies_with_its_supervisor(tmp_path: object) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from support.closures import wait_until

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Rank 0 of a slice whose other host never comes: its process waits to join.
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jaxcluster.worker",
            "--slice-size",
            "2",
            "--slice-index",
            "0",
            "--slice-rank",
            "0",
            "--slice-coordinator",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    children = Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children")
    try:
        child = int(wait_until(lambda: children.read_text().split(), "the serving child")[0])
        assert Path(f"/proc/{child}").exists()
    finally:
        supervisor.kill()
        supervisor.wait()

    def gone() -> bool:
        try:
            return Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"  # reaped by init
        except FileNotFoundError:
            return True

    try:
        wait_until(gone, "the child to die with its supervisor", timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)  # if it outlived its supervisor: no leak
