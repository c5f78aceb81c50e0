"""``create_per_worker_state(..., on_preemption=...)``: the argument is validated; a worker
preempted (SIGTERM, a notice) and started again on its address gets its state from
``init_fn`` under ``"rebuild"``, and from the copy the coordinator took off it before the
notice's deadline under ``"save"`` (``init_fn`` not run there). A save the deadline cuts
short falls back to ``init_fn`` with a WARNING naming the state and the worker."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from jaxcluster import LocalCluster
from jaxcluster.coordinator import DeviceState
from jaxcluster.coordinator.device_state import PreemptionSaves
from support.closures import TESTS_DIR, local_cluster, until_ran_on, wait_until, worker_status
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


def test_on_preemption_is_validated(cluster: Any) -> None:
    with cluster.coordinator() as coordinator:
        with pytest.raises(ValueError, match="on_preemption='keep'; expected 'rebuild'"):
            coordinator.create_per_worker_state(lambda: 0, on_preemption="keep")
        with pytest.raises(ValueError, match="on_worker_restart='rebuild' asks for"):
            coordinator.create_per_worker_state(
                lambda: 0, on_preemption="save", on_worker_restart="lose"
            )
        assert coordinator.create_per_worker_state(lambda: 0).on_preemption == "rebuild"
        saved = coordinator.create_per_worker_state(lambda: 0, on_preemption="save")
        assert saved.on_preemption == "save"
        assert saved.preemption_saves == PreemptionSaves()


@pytest.mark.parametrize("name", [None, "preemption-save-counter"])
def test_a_preempted_worker_starts_again_from_the_copy_saved_before_its_deadline(
    cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str | None
) -> None:
    caplog.set_level(logging.INFO, logger="jaxcluster.coordinator")
    with cluster.coordinator() as coordinator:
        state = coordinator.create_per_worker_state(
            counter_init(str(tmp_path)), on_preemption="save", name=name
        )
        first = cluster.worker_pid(0)
        until_ran_on(coordinator, bump, (state,), 0)
        reached = int(state.fetch(0, timeout=60)["n"])
        assert reached >= 1
        assert inits(tmp_path, first) == 1

        # The notice (SIGTERM; grace 30 s): the worker stays up until its state is copied.
        os.kill(first, signal.SIGTERM)
        wait_until(lambda: state.preemption_saves.saved == 1, "the state's save")
        saves = state.preemption_saves
        assert saves.failed == 0 and saves.bytes > 0
        wait_until(lambda: pid_gone(first), "worker 0 to exit once its state was saved")
        saved = [r.getMessage() for r in caplog.records if "saved device state" in r.getMessage()]
        assert len(saved) == 1 and "worker 0" in saved[0], saved
        assert repr(name) in saved[0] if name else "counter_init" in saved[0]

        cluster.restart_worker(0)  # the replacement, on the same address
        second = cluster.worker_pid(0)
        assert second != first
        after = until_ran_on(coordinator, bump, (state,), 0)
        # It continues from the copy: the first bump there counts on from `reached`.
        assert after == list(range(reached + 1, reached + 1 + len(after)))
        assert inits(tmp_path, second) == 0  # init_fn did not run on the replacement
        assert int(state.fetch(0, timeout=60)["n"]) == reached + len(after)


def test_a_save_the_deadline_cuts_short_falls_back_to_init_fn_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jaxcluster.coordinator")
    path = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)
    # A notice whose deadline is its arrival: no time to copy anything.
    with (
        LocalCluster(2, env={"PYTHONPATH": path}, worker_args=["--preemption-grace", "0"]) as short,
        short.coordinator() as coordinator,
    ):
        state = coordinator.create_per_worker_state(
            counter_init(str(tmp_path)), on_preemption="save"
        )
        coordinator.fetch([coordinator.schedule(bump, args=(state,)) for _ in range(6)])
        assert state.fetch(timeout=60)
        first = short.worker_pid(0)
        os.kill(first, signal.SIGTERM)
        warning = wait_until(
            lambda: [
                r
                for r in caplog.records
                if r.levelno == logging.WARNING and "was NOT saved" in r.getMessage()
            ],
            "the warning that worker 0's state was not saved",
        )
        assert "worker 0" in warning[0].getMessage()
        assert "counter_init.<locals>.init" in warning[0].getMessage()
        assert state.preemption_saves == PreemptionSaves(saved=0, failed=1, bytes=0)
        wait_until(lambda: pid_gone(first), "worker 0 to exit")
        short.restart_worker(0)
        second = short.worker_pid(0)
        after = until_ran_on(coordinator, bump, (state,), 0)
        assert after == list(range(1, len(after) + 1))  # from init_fn, as announced
        assert inits(tmp_path, second) == 1


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
        after = until_ran_on(coordinator, bump, (state,), 0)
        assert after == list(range(1, len(after) + 1))  # from init_fn
        assert inits(tmp_path, second) == 1


_VANISHING_COORDINATOR = """
import sys, time
import numpy as np
from jaxcluster import ClusterSpec
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator

resolver = SimpleClusterResolver(ClusterSpec({"worker": sys.argv[1].split(",")}))
coordinator = ClusterCoordinator(resolver)
state = coordinator.create_per_worker_state(
    lambda: {"n": np.zeros((), np.int32)}, on_preemption="save"
)
coordinator.schedule(lambda s: int(s.value["n"]), args=(state,)).fetch(timeout=120)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_preempted_worker_leaves_once_no_live_session_can_save(tmp_path: Path) -> None:
    """Its coordinator SIGKILLed, nobody will read the state: the worker waits for the
    session's --state-ttl (the coordinator might still come back), then leaves, long
    before its notice's deadline."""
    grace, ttl = 120.0, 2.0
    with LocalCluster(1, state_ttl=ttl, worker_args=["--preemption-grace", str(grace)]) as local:
        env = {**os.environ, "JAXCLUSTER_AUTH_TOKEN": local.auth_token}
        script = tmp_path / "coordinator.py"
        script.write_text(_VANISHING_COORDINATOR)
        coordinator = subprocess.Popen(
            [sys.executable, str(script), ",".join(local.addresses)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        try:
            assert coordinator.stdout is not None
            assert coordinator.stdout.readline().strip() == "ready"
            report = worker_status(local, 0)
            assert sum(s["resources"] for s in report["sessions"]) == 1  # the save state
        finally:
            coordinator.kill()
            coordinator.wait()
        worker = local.worker_pid(0)
        assert worker is not None
        os.kill(worker, signal.SIGTERM)  # the notice: its state awaits a save
        noticed = time.monotonic()
        wait_until(lambda: pid_gone(worker), "the worker to leave", timeout=grace / 2)
        assert time.monotonic() - noticed < grace / 2
