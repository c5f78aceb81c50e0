"""Closure errors against real workers: cancel_all and per_closure, rebuilt exceptions,
functions that cannot load, and closure_timeout."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from jaxcluster import errors
from jaxcluster.coordinator import ClusterCoordinator, RemoteValueStatus
from support.closures import gated_square, wait_for_file, wait_until

NUM_WORKERS = 2


class TrainingDiverged(Exception):
    """A user exception importable on both sides (tests/ is on the workers' path)."""


class NeedsTwoArgs(Exception):
    """Pickles, but cannot be rebuilt from its args: comes back as a RemoteError."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"step {step}: loss {loss}")


def diverge(step: int) -> None:
    raise TrainingDiverged(f"loss became NaN at step {step}")


def fail_when(gate: str, exc: BaseException) -> None:
    if not wait_for_file(gate):
        raise TimeoutError(f"gate {gate} never appeared")
    raise exc


def test_the_first_error_is_raised_by_join_then_cleared(coordinator: ClusterCoordinator) -> None:
    rv = coordinator.schedule(diverge, args=(7,))
    with pytest.raises(TrainingDiverged, match="NaN at step 7") as info:
        coordinator.join()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Raised on worker 127.0.0.1:" in notes
    assert "in diverge" in notes and "Traceback" in notes  # the remote traceback text
    assert rv.status is RemoteValueStatus.READY
    with pytest.raises(TrainingDiverged):
        rv.fetch()
    assert coordinator.join() is True  # cleared
    assert coordinator.schedule(lambda: 1).fetch() == 1


def test_the_error_is_raised_by_schedule_and_by_done(coordinator: ClusterCoordinator) -> None:
    for raise_from in ("schedule", "done"):
        rv = coordinator.schedule(diverge, args=(1,))
        wait_until(rv.done, "the failing closure to end")
        with pytest.raises(TrainingDiverged):
            if raise_from == "schedule":
                coordinator.schedule(lambda: 1)
            else:
                coordinator.done()
        assert coordinator.join() is True


def test_queued_closures_are_cancelled_and_running_ones_finish_first(
    coordinator: ClusterCoordinator, tmp_path: Path
) -> None:
    release, fail_gate = tmp_path / "release", tmp_path / "fail"
    long_running = coordinator.schedule(gated_square, args=(str(tmp_path), 5, str(release)))
    failing = coordinator.schedule(fail_when, args=(str(fail_gate), ValueError("bad batch")))
    queued = [coordinator.schedule(lambda i: i, args=(i,)) for i in range(10)]
    wait_until(lambda: len(list(tmp_path.glob("started-5.*"))) == 1, "the long closure to start")
    joined = threading.Event()

    def release_after_the_failure() -> None:
        wait_until(failing.done, "the failing closure to end")
        # join() must still be waiting for the long-running closure here.
        if not joined.is_set():
            release.touch()

    helper = threading.Thread(target=release_after_the_failure, daemon=True)
    helper.start()
    fail_gate.touch()
    with pytest.raises(ValueError, match="bad batch"):
        coordinator.join()
    joined.set()
    helper.join(timeout=30)
    assert release.exists(), "join raised before the long-running closure was released"
    assert long_running.status is RemoteValueStatus.READY and long_running.fetch() == 25
    for rv in queued:
        assert rv.status is RemoteValueStatus.ABORTED
        with pytest.raises(errors.CancelledError, match="another closure failed first"):
            rv.fetch()
    assert coordinator.join() is True
    assert coordinator.schedule(lambda: "usable").fetch() == "usable"


def test_per_closure_policy_keeps_errors_on_their_values(cluster: Any) -> None:
    with cluster.coordinator(error_policy="per_closure") as coordinator:
        bad = coordinator.schedule(diverge, args=(3,))
        good = [coordinator.schedule(lambda i: i + 1, args=(i,)) for i in range(20)]
        assert coordinator.join() is True
        assert coordinator.done() is True
        assert [rv.fetch() for rv in good] == list(range(1, 21))
        with pytest.raises(TrainingDiverged):
            bad.fetch()
        assert coordinator.metrics()["failed"] >= 1


def test_an_exception_that_cannot_be_rebuilt_is_a_remote_error(
    coordinator: ClusterCoordinator,
) -> None:
    def raise_it() -> None:
        raise NeedsTwoArgs(3, 0.5)

    rv = coordinator.schedule(raise_it)
    with pytest.raises(errors.RemoteError) as info:
        coordinator.join()
    assert info.value.type_name == "test_coordinator_errors.NeedsTwoArgs"
    assert "step 3: loss 0.5" in str(info.value) and "127.0.0.1:" in str(info.value)
    assert "in raise_it" in info.value.remote_traceback
    with pytest.raises(errors.RemoteError):
        rv.fetch()


def test_a_function_that_cannot_load_on_the_worker_fails_its_value(
    coordinator: ClusterCoordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module only the coordinator can import: the function is pickled by reference, and
    # the worker cannot find it.
    (tmp_path / "coordinator_only_mod.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import coordinator_only_mod  # type: ignore[import-not-found]

    try:
        rv = coordinator.schedule(coordinator_only_mod.f)
        with pytest.raises(Exception, match="coordinator_only_mod") as info:
            rv.fetch()
        assert "could not be unpickled on this worker" in str(info.value)
        with pytest.raises(type(info.value)):
            coordinator.join()
    finally:
        sys.modules.pop("coordinator_only_mod", None)
    assert coordinator.join() is True


def test_closure_timeout_retries_once_then_fails_naming_the_worker(
    cluster: Any, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    with cluster.coordinator(closure_timeout=1.0) as coordinator:
        rv = coordinator.schedule(gated_square, args=(str(tmp_path), 2, str(release)))
        try:
            with pytest.raises(errors.DeadlineExceededError) as info:
                rv.fetch()
            assert "127.0.0.1:" in str(info.value)
            # It ran on one worker, timed out, and was retried once on the other.
            assert len(list(tmp_path.glob("started-2.*"))) == 2
        finally:
            release.touch()
        with pytest.raises(errors.DeadlineExceededError):
            coordinator.join()
        # Once the workers are idle again, closures run normally.
        assert coordinator.schedule(lambda: "after").fetch() == "after"
