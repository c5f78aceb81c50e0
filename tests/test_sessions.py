"""Sessions (SPEC §12): what a coordinator creates on a worker is its own, is released when
it shuts down or vanishes, and named state survives a coordinator that was killed.

Real processes on loopback: one ``jaxcluster worker`` (a ``LocalCluster``) and coordinators
in subprocesses of their own, as two programs sharing a worker would be.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jaxcluster import LocalCluster
from jaxcluster._auth import AUTH_TOKEN_ENV
from jaxcluster._native import core

pytestmark = pytest.mark.timeout(300)

#: A vanished coordinator's values are released this long after its connection closed.
TTL_SECONDS = 2.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_workers=1, state_ttl=TTL_SECONDS) as cluster:
        yield cluster


def _status(cluster: LocalCluster) -> Any:
    return core.WorkerClient(cluster.addresses[0], cluster.auth_token).get_status()


def _wait_for(what: str, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _held(cluster: LocalCluster, session: str) -> Any:
    return next((s for s in _status(cluster).sessions if s.id == session), None)


# A coordinator program: connects to the worker, creates its values, says READY, waits for
# GO (a file), then prints what its closures read.
_PROGRAM = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import numpy as np
    from jaxcluster import ClusterCoordinator
    from jaxcluster.cluster_resolver import SimpleClusterResolver
    from jaxcluster.cluster_spec import ClusterSpec

    address, k, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    resolver = SimpleClusterResolver(ClusterSpec({"worker": [address]}))
    coordinator = ClusterCoordinator(resolver)
    state = coordinator.create_per_worker_state(lambda: {"v": np.full(4, k, np.float32)})
    dataset = coordinator.create_per_worker_dataset(lambda: iter([k] * 100))
    iterator = iter(dataset)
    coordinator.join()
    state.fetch(0)  # built
    coordinator.schedule(lambda it: 0, args=(iterator,)).fetch()  # iterator built
    print("READY", flush=True)
    deadline = time.monotonic() + 120
    while not go.exists():
        assert time.monotonic() < deadline, "never told to go"
        time.sleep(0.02)
    own = coordinator.schedule(lambda s: float(s.value["v"][0]), args=(state,)).fetch()
    item = coordinator.schedule(lambda it: next(it), args=(iterator,)).fetch()
    print("STATE", own, "ITEM", item, flush=True)
    coordinator.shutdown()
    """
)


def _start(cluster: LocalCluster, *args: str, program: str = _PROGRAM) -> subprocess.Popen[str]:
    env = {**os.environ, AUTH_TOKEN_ENV: cluster.auth_token, "JAXCLUSTER_LOG_LEVEL": "INFO"}
    return subprocess.Popen(
        [sys.executable, "-c", program, cluster.addresses[0], *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _read_line(process: subprocess.Popen[str], prefix: str) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line.strip()
    _, err = process.communicate(timeout=30)
    raise AssertionError(f"the program ended without printing {prefix}: {err[-3000:]}")


def test_two_coordinators_on_one_worker_each_read_their_own_values(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    first = _start(cluster, "1", str(go))
    second = _start(cluster, "2", str(go))
    try:
        # Both have created their state, dataset and iterator (the same resource ids in
        # each process) before either reads.
        _read_line(first, "READY")
        _read_line(second, "READY")
        go.touch()
        assert _read_line(first, "STATE") == "STATE 1.0 ITEM 1"
        assert _read_line(second, "STATE") == "STATE 2.0 ITEM 2"
        assert first.wait(60) == 0 and second.wait(60) == 0
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_clean_shutdown_releases_the_session_at_once(cluster: LocalCluster) -> None:
    coordinator = cluster.coordinator()
    session = coordinator.session_id
    assert len(session) == 32 and int(session, 16) >= 0
    state = coordinator.create_per_worker_state(lambda: np.zeros(1 << 18, np.float32))
    state.fetch(0)
    held = _held(cluster, session)
    assert held is not None and held.bytes >= 1 << 20 and held.resources == 1
    assert held.connections >= 1
    coordinator.shutdown()
    # Released by EndSession, not by the ttl: its connection may still be open.
    _wait_for("the session's release", lambda: _held(cluster, session) is None, TTL_SECONDS)


_KILLED = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from jaxcluster import ClusterCoordinator
    from jaxcluster.cluster_resolver import SimpleClusterResolver
    from jaxcluster.cluster_spec import ClusterSpec

    resolver = SimpleClusterResolver(ClusterSpec({"worker": [sys.argv[1]]}))
    coordinator = ClusterCoordinator(resolver)
    state = coordinator.create_per_worker_state(lambda: np.ones(1 << 16, np.float32))
    state.fetch(0)
    print("SESSION", coordinator.session_id, flush=True)
    time.sleep(600)
    """
)


def test_a_vanished_session_is_released_after_the_state_ttl(cluster: LocalCluster) -> None:
    process = _start(cluster, program=_KILLED)
    try:
        session = _read_line(process, "SESSION").split()[1]
        held = _held(cluster, session)
        assert held is not None and held.bytes >= 1 << 18
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        gone_at = time.monotonic()
        _wait_for("the vanished session's release", lambda: _held(cluster, session) is None)
        # Not before the ttl (its connection closed at most a moment after the kill).
        assert time.monotonic() - gone_at >= TTL_SECONDS * 0.5
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# A training loop on named state: parameters and a step counter stay on the worker. It
# writes a marker file whenever init_fn runs (on the worker), and prints each step.
_TRAIN = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from jaxcluster import ClusterCoordinator
    from jaxcluster.cluster_resolver import SimpleClusterResolver
    from jaxcluster.cluster_spec import ClusterSpec

    address, marker, pause_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    resolver = SimpleClusterResolver(ClusterSpec({"worker": [address]}))
    coordinator = ClusterCoordinator(resolver)

    def init():
        with open(marker, "a") as f:
            f.write("init\\n")
        return {"w": np.zeros(8, np.float32), "step": np.zeros((), np.int64)}

    state = coordinator.create_per_worker_state(init, name="trainer")
    print("REATTACHED", state.reattached, flush=True)

    def train(s):
        v = s.value
        step, w = int(v["step"]) + 1, np.asarray(v["w"]) + 1.0
        s.assign({"w": w, "step": np.asarray(step, np.int64)})
        return step, float(w[0])

    while True:
        step, w = coordinator.schedule(train, args=(state,)).fetch()
        print("STEP", step, w, flush=True)
        if step == pause_at:
            time.sleep(600)  # killed here
        if step >= 150:
            break
    coordinator.shutdown()
    """
)


def test_named_state_survives_a_killed_coordinator(tmp_path: Path) -> None:
    # A ttl long enough for the program to start again (importing JAX takes seconds).
    marker = tmp_path / "init-ran"
    with LocalCluster(num_workers=1, state_ttl=300) as cluster:
        incarnation = _status(cluster).incarnation
        _train_killed_and_restarted(cluster, marker)
        assert _status(cluster).incarnation == incarnation, "the worker restarted"
    assert marker.read_text() == "init\n", "init_fn ran again"


def _train_killed_and_restarted(cluster: LocalCluster, marker: Path) -> None:
    """Runs the training program to step 100, SIGKILLs it, and runs it again to step 150;
    asserts each run's re-attachment and steps."""
    first = _start(cluster, str(marker), "100", program=_TRAIN)
    try:
        assert _read_line(first, "REATTACHED") == "REATTACHED False"
        assert _read_line(first, "STEP 100") == "STEP 100 100.0"
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert marker.read_text() == "init\n"
    second = _start(cluster, str(marker), "0", program=_TRAIN)
    try:
        assert _read_line(second, "REATTACHED") == "REATTACHED True"
        # It goes on from step 100 with the parameters the killed program left.
        assert _read_line(second, "STEP") == "STEP 101 101.0"
        assert _read_line(second, "STEP 150") == "STEP 150 150.0"
        assert second.wait(120) == 0
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
