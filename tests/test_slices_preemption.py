"""``on_preemption="save"`` on a multi-host slice (SPEC §11: a slice fails and recovers as a
unit; §12: preemption). A notice on any host of a slice is the slice's notice: rank 0
reports the slice ``preempting`` (with the host's source and deadline), the coordinator
counts one preemption and copies the state off the slice (the save runs on every host, the
preempted one included, which then leaves at once instead of waiting for its deadline),
and the slice's replacement starts from the copy, sharded over the slice as it was, without
running ``init_fn``."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from jaxcluster import LocalCluster
from jaxcluster.coordinator import DeviceState
from support.closures import slice_cluster, wait_until
from support.workers import pid_gone

jax = pytest.importorskip("jax")

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOSTS, DEVICES = 2, 2
#: The hosts' --preemption-grace (LocalCluster's default notice is SIGTERM, 30 s).
GRACE = 30.0
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with slice_cluster(HOSTS, HOSTS, DEVICES) as local:
        yield local


def sharded_init(directory: str) -> Any:
    """An ``init_fn``: zeros sharded over every device of the slice; one marker per run."""

    def init() -> dict[str, Any]:
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        Path(directory, f"init-{os.getpid()}").touch()
        mesh = Mesh(np.array(jax.devices()), ("d",))
        zeros = np.zeros(8, np.float32)
        sharding = NamedSharding(mesh, PartitionSpec("d"))
        return {"w": jax.make_array_from_callback((8,), sharding, lambda i: zeros[i])}

    return init


def bump(state: DeviceState) -> tuple[int, bool, float]:
    """Runs SPMD on the slice: adds one; the devices the state spans, whether one host
    holds all of it, and its new first element."""
    w = jax.jit(lambda w: w + 1)(state.value["w"])
    state.assign({"w": w})
    first = float(np.asarray(w.addressable_shards[0].data)[0])
    return len(w.sharding.device_set), w.is_fully_addressable, first


@pytest.mark.parametrize("rank", [0, 1])
def test_a_notice_on_one_host_saves_the_slice_state_for_its_replacement(
    cluster: LocalCluster, tmp_path: Path, rank: int
) -> None:
    with cluster.coordinator(recovery_timeout=240) as coordinator:
        state = coordinator.create_per_worker_state(
            sharded_init(str(tmp_path)), on_preemption="save"
        )
        for _ in range(3):
            assert coordinator.schedule(bump, args=(state,)).fetch(timeout=120)[:2] == (
                HOSTS * DEVICES,
                False,
            )
        np.testing.assert_array_equal(state.fetch(0, timeout=60)["w"], np.full(8, 3.0))
        inits = len(list(tmp_path.glob("init-*")))
        assert inits == HOSTS  # init_fn ran once on each host of the slice

        victim = cluster.worker_pid(rank)
        assert victim is not None
        os.kill(victim, signal.SIGTERM)  # the notice reaches this host only
        wait_until(lambda: state.preemption_saves.saved == 1, "the slice's state to be saved")
        assert state.preemption_saves.failed == 0
        assert coordinator.metrics()["preemptions"] == {"signal": 1}
        # Saved on every host, the preempted one leaves well before its deadline.
        wait_until(lambda: pid_gone(victim), "the preempted host to exit", timeout=GRACE / 2)

        cluster.restart_worker(rank)  # the preempted host's replacement
        devices, one_host, first = coordinator.schedule(bump, args=(state,)).fetch(timeout=240)
        assert (devices, one_host) == (HOSTS * DEVICES, False)  # sharded as it was
        assert first == 4.0  # from the copy: 3 bumps, then this one
        np.testing.assert_array_equal(state.fetch(0, timeout=60)["w"], np.full(8, 4.0))
        assert len(list(tmp_path.glob("init-*"))) == inits  # init_fn ran nowhere again
