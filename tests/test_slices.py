"""Multi-host slices on one machine: 2 slices x 2 host processes x 2 forced CPU devices,
cross-process collectives through gloo, real SIGKILL and SIGSTOP of one host."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jaxcluster import LocalCluster, errors
from jaxcluster.coordinator import ClusterCoordinator, get_current_worker_index
from support.closures import TESTS_DIR, slice_cluster, wait_for_file, wait_until

HOSTS, DEVICES, SLICES = 2, 2, 2
pytestmark = pytest.mark.timeout(600)


def _shard_map() -> Any:
    import jax

    if hasattr(jax, "shard_map"):
        return jax.shard_map
    from jax.experimental.shard_map import shard_map

    return shard_map


def _global(n: int) -> Any:
    """``arange(n)`` as one array sharded over every device of the slice."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("d",))
    return mesh, jax.make_array_from_callback(
        (n,), NamedSharding(mesh, P("d")), lambda idx: jnp.arange(n, dtype=jnp.float32)[idx]
    )


def slice_psum(n: int) -> tuple[int, int, int, float]:
    """Runs on a slice: a psum over all its devices of each device's part of arange(n)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh, x = _global(n)
    total = jax.jit(
        _shard_map()(
            lambda part: jax.lax.psum(jnp.sum(part), "d"), mesh=mesh, in_specs=P("d"), out_specs=P()
        )
    )(x)
    return jax.process_count(), jax.device_count(), jax.local_device_count(), float(total)


def doubled(n: int) -> Any:
    """Runs on a slice: an output sharded across its hosts (gathered whole for rank 0)."""
    import jax

    _, x = _global(n)
    return jax.jit(lambda a: a * 2)(x)


def slice_pids(pause: float = 0.0) -> tuple[int, list[int]]:
    """Runs on a slice: its worker index and the pids of all its host processes."""
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    time.sleep(pause)
    pids = multihost_utils.process_allgather(jnp.array([os.getpid()], dtype=jnp.int32))
    return get_current_worker_index(), sorted(int(p) for p in np.asarray(pids).ravel())


def fail_on_rank_one() -> int:
    import jax

    if jax.process_index() == 1:
        raise ValueError("rank one refuses")
    return 7


def gated_collective(directory: str, i: int, gate: str, only_rank_one_waits: bool) -> int:
    """Runs on a slice: marks its start, waits for ``gate`` (on every host, or on rank 1
    only, so rank 0 waits inside the collective), then an all-gather across the slice."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    rank = jax.process_index()
    Path(directory, f"started-{i}-{get_current_worker_index()}-{rank}-{os.getpid()}").touch()
    if (rank == 1 or not only_rank_one_waits) and not wait_for_file(gate):
        raise TimeoutError(f"gate {gate} never appeared")
    gathered = multihost_utils.process_allgather(jnp.array([i + rank], dtype=jnp.int32))
    return int(np.asarray(gathered).sum())


def counted_dataset(directory: str) -> Iterator[tuple[int, int]]:
    """A dataset_fn: records which host built it; yields (slice, n)."""
    Path(directory, f"built-{get_current_worker_index()}-{os.getpid()}").touch()
    index = get_current_worker_index()
    return ((index, n) for n in range(100_000))


def take_with_pids(iterator: Iterator[Any]) -> tuple[Any, tuple[int, list[int]]]:
    return next(iterator), slice_pids()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with slice_cluster(SLICES * HOSTS, HOSTS, DEVICES) as local:
        yield local


@pytest.fixture
def coordinator(cluster: LocalCluster) -> Iterator[ClusterCoordinator]:
    _wait_all_slices(cluster)
    with cluster.coordinator(error_policy="per_closure") as coordinator:
        yield coordinator


def _host_pids(cluster: LocalCluster, slice_index: int) -> list[int] | None:
    pids = [cluster.worker_pid(slice_index * HOSTS + r) for r in range(HOSTS)]
    return None if None in pids else sorted(p for p in pids if p is not None)


def _wait_all_slices(cluster: LocalCluster) -> None:
    """Until every slice serves closures with the hosts now running (after a fault)."""
    with cluster.coordinator(heartbeat_timeout=10.0) as probe:

        def formed() -> bool:
            wanted = {s: _host_pids(cluster, s) for s in range(SLICES)}
            results = probe.fetch([probe.schedule(slice_pids, args=(0.05,)) for _ in range(8)])
            seen = {index: pids for index, pids in results}
            return all(wanted[s] is not None and seen.get(s) == wanted[s] for s in range(SLICES))

        wait_until(formed, "every slice to serve with its current hosts", timeout=240, every=0.5)


def test_psum_spans_every_device_of_a_slice(coordinator: ClusterCoordinator) -> None:
    n = 4096
    results = coordinator.fetch([coordinator.schedule(slice_psum, args=(n,)) for _ in range(4)])
    for processes, devices, local, total in results:
        assert (processes, devices, local) == (HOSTS, HOSTS * DEVICES, DEVICES)
        assert total == float(np.arange(n, dtype=np.float32).sum())


def test_sharded_output_is_gathered_whole(coordinator: ClusterCoordinator) -> None:
    value = coordinator.schedule(doubled, args=(16,)).fetch()
    np.testing.assert_array_equal(np.asarray(value), np.arange(16, dtype=np.float32) * 2)


def test_closures_spread_over_both_slices_and_run_on_all_hosts(
    cluster: LocalCluster, coordinator: ClusterCoordinator
) -> None:
    results = coordinator.fetch([coordinator.schedule(slice_pids, args=(0.3,)) for _ in range(8)])
    by_slice = {index: pids for index, pids in results}
    assert set(by_slice) == set(range(SLICES))
    for index, pids in by_slice.items():
        assert pids == _host_pids(cluster, index)  # every host of that slice ran it
    assert coordinator.slices == cluster.slices


def test_an_error_on_one_host_fails_the_closure(coordinator: ClusterCoordinator) -> None:
    value = coordinator.schedule(fail_on_rank_one)
    with pytest.raises(ValueError, match="rank one refuses") as info:
        value.fetch()
    # The remote traceback (a note on the exception) names the host that raised.
    notes = "".join(getattr(info.value, "__notes__", ()))
    assert "on slice host rank 1 at" in notes, notes
    assert coordinator.schedule(slice_pids).fetch()[0] in range(SLICES)  # slice still serves


def test_sigkill_of_one_host_mid_closure(
    cluster: LocalCluster, coordinator: ClusterCoordinator, tmp_path: Path
) -> None:
    gate = str(tmp_path / "gate")
    values = [
        coordinator.schedule(gated_collective, args=(str(tmp_path), i, gate, False))
        for i in range(SLICES)
    ]
    started = lambda: sorted(tmp_path.glob("started-*"))  # noqa: E731
    wait_until(lambda: len(started()) == SLICES * HOSTS, "both closures started on both slices")
    victim_slice = 0
    before = _host_pids(cluster, victim_slice)
    cluster.kill_worker(victim_slice * HOSTS + 1)  # rank 1 of slice 0, inside the closure
    Path(gate).touch()
    assert [v.fetch() for v in values] == [2 * i + 1 for i in range(SLICES)]
    # The killed closure ran again (on the other slice or on slice 0 re-formed).
    reruns = [p for p in started() if p.name.startswith(f"started-{victim_slice}-")]
    assert len({p.name.split("-")[1] for p in started()}) == SLICES
    assert len(started()) > SLICES * HOSTS, reruns
    _wait_all_slices(cluster)
    after = _host_pids(cluster, victim_slice)
    assert after is not None and before is not None
    assert not set(after) & set(before)  # both hosts of the broken slice restarted
    results = coordinator.fetch([coordinator.schedule(slice_pids, args=(0.2,)) for _ in range(8)])
    assert {index for index, _ in results} == set(range(SLICES))


def test_sigstop_inside_a_collective_fails_the_slice_within_a_bound(
    cluster: LocalCluster, coordinator: ClusterCoordinator, tmp_path: Path
) -> None:
    gate = str(tmp_path / "gate")
    value = coordinator.schedule(gated_collective, args=(str(tmp_path), 5, gate, True))
    first = wait_until(lambda: sorted(tmp_path.glob("started-5-*-1-*")), "rank 1 to start")
    slice_index = int(first[0].name.split("-")[2])
    frozen = int(first[0].name.split("-")[4])
    os.kill(frozen, signal.SIGSTOP)  # rank 0 is inside the all-gather waiting for it
    try:
        stopped_at = time.monotonic()
        Path(gate).touch()
        assert value.fetch() == 2 * 5 + 1  # ran again on the other slice
        assert time.monotonic() - stopped_at < 90, "the slice was not failed within a bound"
        ran_on = {int(p.name.split("-")[2]) for p in tmp_path.glob("started-5-*")}
        assert ran_on == {0, 1}
        assert slice_index in ran_on
    finally:
        os.kill(frozen, signal.SIGCONT)
    _wait_all_slices(cluster)  # thawed, it sees its slice gone, restarts and re-forms


def test_per_slice_datasets_are_rebuilt_after_recovery(
    cluster: LocalCluster, coordinator: ClusterCoordinator, tmp_path: Path
) -> None:
    dataset = coordinator.create_per_worker_dataset(lambda: counted_dataset(str(tmp_path)))
    iterator = iter(dataset)
    results = coordinator.fetch(
        [coordinator.schedule(take_with_pids, args=(iterator,)) for _ in range(8)]
    )
    for (built_on, _), (ran_on, _) in results:
        assert built_on == ran_on
    built = lambda: {p.name for p in tmp_path.glob("built-*")}  # noqa: E731
    before = built()
    assert before == {
        f"built-{s}-{pid}" for s in range(SLICES) for pid in _host_pids(cluster, s) or []
    }  # every host of every slice built its own iterator
    cluster.kill_worker(HOSTS)  # rank 0 of slice 1
    _wait_all_slices(cluster)
    new_pids = _host_pids(cluster, 1) or []

    def rebuilt_and_used() -> bool:
        got = coordinator.fetch(
            [coordinator.schedule(take_with_pids, args=(iterator,)) for _ in range(4)]
        )
        return any(index == 1 and pids == new_pids for _, (index, pids) in got)

    wait_until(rebuilt_and_used, "slice 1 to run closures on its rebuilt dataset", timeout=120)
    assert {f"built-1-{pid}" for pid in new_pids} <= built()


def test_hosts_that_disagree_about_their_slice_are_refused() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "JAXCLUSTER_AUTH_TOKEN": "t0k3n", "JAX_PLATFORMS": "cpu"}
    common = ["--slice-size", "2", "--slice-coordinator", f"127.0.0.1:{port}"]
    common += ["--slice-init-timeout", "60"]
    hosts = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jaxcluster.worker",
                "--address",
                "127.0.0.1:0",
                "--slice-index",
                str(rank),
                "--slice-rank",
                str(rank),
                *common,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [h.communicate(timeout=180) for h in hosts]
    for host, (_, err) in zip(hosts, outputs, strict=True):
        assert host.returncode == 2, err
        assert "the hosts of slice" in err and "disagree" in err, err
        assert "rank 0 at 127.0.0.1:" in err and "says slice 0 of 2 hosts" in err, err
        assert "rank 1 at 127.0.0.1:" in err and "says slice 1 of 2 hosts" in err, err


def sharded_state() -> Any:
    """An init_fn: state sharded over every device of the slice."""
    _, x = _global(8)
    return {"w": x}


def increment(state: Any) -> float:
    import jax

    state.assign({"w": jax.jit(lambda w: w + 1)(state.value["w"])})
    return get_current_worker_index()


def test_device_state_stays_sharded_across_the_slice(
    coordinator: ClusterCoordinator,
) -> None:
    state = coordinator.create_per_worker_state(sharded_state)
    ran_on = coordinator.fetch([coordinator.schedule(increment, args=(state,)) for _ in range(6)])
    assert coordinator.join() is True
    for s in range(SLICES):
        times = ran_on.count(s)
        np.testing.assert_array_equal(
            np.asarray(state.fetch(s)["w"]), np.arange(8, dtype=np.float32) + times
        )


def test_a_coordinator_that_groups_hosts_wrongly_is_told_why(cluster: LocalCluster) -> None:
    peer, leader = cluster.slices[0][1], cluster.slices[0][0]
    # A peer is never a slice's entry point, and rank 0 of a 2-host slice is not a worker
    # of its own: neither is used, and the error says what to change.
    for slices, expected in (
        ([[peer]], f"is rank 1 of slice 0 ({HOSTS} hosts)"),
        ([[leader]], f"give it hosts_per_slice={HOSTS}"),
    ):
        with (
            ClusterCoordinator(
                slices=slices, auth_token=cluster.auth_token, connect_timeout=2.0
            ) as coordinator,
            pytest.raises(errors.UnavailableError, match=re.escape(expected)),
        ):
            coordinator.schedule(os.getpid).fetch()
    from jaxcluster._native import core

    reported = [
        core.WorkerClient(address, auth_token=cluster.auth_token).get_status()
        for address in cluster.addresses
    ]
    assert [(s["slice_index"], s["slice_rank"], s["slice_size"]) for s in reported] == [
        (i // HOSTS, i % HOSTS, HOSTS) for i in range(SLICES * HOSTS)
    ]


def test_given_up_slice_leaves_the_other_and_all_gone_is_unavailable(tmp_path: Path) -> None:
    path = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)
    with (
        LocalCluster(
            num_workers=SLICES * HOSTS,
            hosts_per_slice=HOSTS,
            devices_per_host=1,
            env={"PYTHONPATH": path},
            worker_args=["--slice-heartbeat-timeout", "3", "--slice-init-timeout", "5"],
        ) as local,
        local.coordinator(recovery_timeout=3.0, error_policy="per_closure") as coordinator,
    ):
        assert len(coordinator.fetch([coordinator.schedule(slice_pids) for _ in range(4)])) == 4
        local.kill_worker(1, supervisor=True)  # slice 0 loses a host for good
        survivors = _host_pids(local, 1)

        def only_slice_one_serves() -> bool:
            # The coordinator learns of a failure when it sends the slice work.
            coordinator.fetch([coordinator.schedule(slice_pids) for _ in range(2)])
            return coordinator.workers[0]["state"] == "given_up"

        wait_until(only_slice_one_serves, "slice 0 to be given up", timeout=120)
        results = coordinator.fetch([coordinator.schedule(slice_pids) for _ in range(4)])
        assert {index for index, _ in results} == {1}
        assert all(pids == survivors for _, pids in results)
        local.kill_worker(HOSTS, supervisor=True)  # and slice 1: nothing left
        with pytest.raises(errors.UnavailableError):
            coordinator.schedule(slice_pids).fetch()
        assert [w["state"] for w in coordinator.workers] == ["given_up", "given_up"]


def test_status_reports_each_hosts_slice(cluster: LocalCluster) -> None:
    import json

    done = subprocess.run(
        [sys.executable, "-m", "jaxcluster", "status", *cluster.addresses, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAXCLUSTER_AUTH_TOKEN": cluster.auth_token},
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [
        (r["details"]["slice_index"], r["details"]["slice_rank"], r["details"]["slice_size"])
        for r in rows
    ] == [(i // HOSTS, i % HOSTS, HOSTS) for i in range(SLICES * HOSTS)]
