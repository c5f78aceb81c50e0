"""``create_per_worker_state(..., on_preemption=...)``: the argument is validated, and a
worker preempted (SIGTERM, a notice) and started again on its address gets its state from
``init_fn`` under ``"rebuild"``. ``"save"`` is not built yet: it raises
``NotImplementedError`` rather than quietly rebuild (see ``device_state.py``)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from jaxcluster.coordinator import DeviceState
from support.closures import local_cluster, wait_until
from support.workers import pid_gone

jax = pytest.importorskip("jax")
jnp = jax.numpy

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster(2) as c:
        yield c


def counter_init(directory: str) -> Any:
    """An ``init_fn`` that leaves one marker file (named by its process) per run."""

    def init() -> dict[str, Any]:
        Path(directory, f"init-{os.getpid()}").touch()
        return {"n": jnp.zeros((), jnp.int32)}

    return init


def bump(state: DeviceState) -> tuple[int, int]:
    """Runs on a worker: adds one to its counter; its index and the new count."""
    from jaxcluster.coordinator import get_current_worker_index

    state.assign({"n": state.value["n"] + 1})
    return get_current_worker_index(), int(state.value["n"])


def inits(directory: Path, pid: int | None) -> int:
    return sum(1 for path in directory.iterdir() if path.name == f"init-{pid}")


def test_on_preemption_is_validated_and_save_says_it_is_not_supported(cluster: Any) -> None:
    with cluster.coordinator() as coordinator:
        with pytest.raises(ValueError, match="on_preemption='keep'; expected 'rebuild'"):
            coordinator.create_per_worker_state(lambda: 0, on_preemption="keep")
        assert coordinator.create_per_worker_state(lambda: 0).on_preemption == "rebuild"
        with pytest.raises(NotImplementedError, match="on_preemption='save' is not supported"):
            coordinator.create_per_worker_state(lambda: 0, on_preemption="save")


def test_a_preempted_worker_rebuilds_its_state_from_init_fn_by_default(
    cluster: Any, tmp_path: Path
) -> None:
    with cluster.coordinator() as coordinator:
        state = coordinator.create_per_worker_state(counter_init(str(tmp_path)))
        first = cluster.worker_pid(0)
        coordinator.fetch([coordinator.schedule(bump, args=(state,)) for _ in range(6)])
        assert sum(int(value["n"]) for value in state.fetch(timeout=60)) == 6
        assert inits(tmp_path, first) == 1

        # A notice: LocalCluster starts its workers with --preemption-notice signal.
        os.kill(first, signal.SIGTERM)
        wait_until(lambda: pid_gone(first), "worker 0 to drain and exit")
        cluster.restart_worker(0)  # the replacement, on the same address
        second = cluster.worker_pid(0)
        assert second != first

        # Work for worker 0 lets the coordinator see the new incarnation and rebuild there.
        after = wait_until(
            lambda: [
                r
                for r in coordinator.fetch(
                    [coordinator.schedule(bump, args=(state,)) for _ in range(8)]
                )
                if r[0] == 0
            ],
            "a closure on the restarted worker",
        )
        assert [n for _, n in after] == list(range(1, len(after) + 1))  # from init_fn
        assert inits(tmp_path, second) == 1
