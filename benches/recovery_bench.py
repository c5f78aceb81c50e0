"""Recovery times (issue 29 item 5): how long each interruption costs, side by side.

1. worker SIGKILL -> its closure running elsewhere: from the kill to the closure's second
   start (on another worker), and to its result.
2. slice host SIGKILL -> the slice serving again: ``LocalCluster(num_workers=4,
   hosts_per_slice=2)``, rank 1 of slice 0 killed, until the coordinator has it up with new
   processes.
3. TF's way to survive a coordinator restart, the baseline: a job restarted from a
   checkpoint, timed as a ``ParameterServerStrategy.save`` / ``restore`` round trip of
   ``--state-mib`` MiB of variables (a new strategy, as the restarted program makes).

Three figures need features not built yet; their hooks (``preemption_to_last_closure``,
``preemption_state_saved``, ``coordinator_restart_to_first_closure``) return ``None`` and the
table says so. Whoever adds the feature fills in the hook.

Usage: python benches/recovery_bench.py [--kills N] [--state-mib M] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

# Long enough that a SIGKILL lands while it runs; the second run returns at once.
FIRST_RUN_SECONDS = 60.0


def resumable(directory: str, i: int) -> int:
    """Runs on a worker: records its start (pid, wall time); sleeps on its first run only,
    so the run that replaces a killed one ends at once. Returns the pid."""
    first = not any(Path(directory).glob(f"start-{i}-*"))
    Path(directory, f"start-{i}-{os.getpid()}").write_text(f"{time.time():.6f}")
    if first:
        time.sleep(FIRST_RUN_SECONDS)
    return os.getpid()


def _starts(directory: Path, i: int) -> list[tuple[float, int]]:
    """(wall time, pid) of each start of closure ``i``, oldest first."""
    found = []
    for marker in directory.glob(f"start-{i}-*"):
        text = marker.read_text()
        if text:
            found.append((float(text), int(marker.name.rsplit("-", 1)[1])))
    return sorted(found)


def _wait(predicate: Any, what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    raise TimeoutError(f"timed out waiting for {what}")


def worker_kill_to_rerun(kills: int) -> list[tuple[float, float]]:
    """(kill -> second start, kill -> result) in seconds, per kill."""
    from jaxcluster import LocalCluster

    here = os.path.dirname(os.path.abspath(__file__))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    figures = []
    with (
        tempfile.TemporaryDirectory() as work,
        LocalCluster(2, env=env) as cluster,
        cluster.coordinator() as coordinator,
    ):
        directory = Path(work)
        for i in range(kills):
            # Every worker up again (the one restarted last time reconnected), so the kill
            # is the only thing the re-run waits for.
            _wait(lambda: all(w.state == "up" for w in coordinator.workers), "all workers up")
            value = coordinator.schedule(resumable, args=(work, i))
            _, pid = _wait(lambda i=i: _starts(directory, i), "the first start")[0]
            index = next(k for k in range(cluster.num_workers) if cluster.worker_pid(k) == pid)
            killed = time.time()
            cluster.kill_worker(index)
            _wait(lambda i=i: len(_starts(directory, i)) > 1, "the second start")
            rerun = _starts(directory, i)[1][0] - killed
            value.fetch()
            figures.append((max(rerun, 0.0), time.time() - killed))
            cluster.restart_worker(index)
    return figures


def slice_host_kill_to_serving(kills: int) -> list[float]:
    """Seconds from SIGKILL of one host of slice 0 to the slice serving again, per kill."""
    from jaxcluster import LocalCluster
    from jaxcluster.demos.slices import wait_serving_again

    figures = []
    with (
        LocalCluster(4, hosts_per_slice=2, devices_per_host=1) as cluster,
        cluster.coordinator() as coordinator,
    ):
        coordinator.fetch([coordinator.schedule(os.getpid) for _ in range(4)])
        for _ in range(kills):
            report = coordinator.workers[0].report
            before = report.incarnation if report is not None else 0
            killed = time.monotonic()
            cluster.kill_worker(1)
            recovered = wait_serving_again(coordinator, before, killed, timeout=300)
            if recovered is None:
                raise TimeoutError("slice 0 did not serve again within 300 s")
            figures.append(recovered)
    return figures


def checkpoint_round_trip(state_mib: int) -> tuple[float, float]:
    """(save, restore) seconds of ``state_mib`` MiB of ParameterServerStrategy variables on
    2 ps tasks: what a TF job restarted from its checkpoint pays (the restore into a new
    strategy, as the restarted program builds it)."""
    from jaxcluster import LocalCluster
    from jaxcluster.strategy import FixedShardsPartitioner, ParameterServerStrategy

    pieces = 4
    per_piece = state_mib * 1024 * 1024 // 4 // pieces  # float32 elements

    def model(cluster: Any) -> tuple[Any, list[Any]]:
        strategy = ParameterServerStrategy(
            cluster.resolver, FixedShardsPartitioner(2), auth_token=cluster.auth_token
        )
        with strategy.scope():
            variables = [
                strategy.Variable(np.full((per_piece // 256, 256), k, np.float32), name=f"w{k}")
                for k in range(pieces)
            ]
        return strategy, variables

    with tempfile.TemporaryDirectory() as work, LocalCluster(1, num_ps=2) as cluster:
        path = Path(work, "model.jaxc")
        strategy, _ = model(cluster)
        start = time.perf_counter()
        strategy.save(path)
        saved = time.perf_counter() - start
        restarted, variables = model(cluster)
        start = time.perf_counter()
        restarted.restore(path)
        restored = time.perf_counter() - start
        assert float(variables[-1].read_value()[0, 0]) == pieces - 1
    return saved, restored


# --- Hooks for the figures other parts of issue 29 enable (not implemented here). ---


def preemption_to_last_closure() -> float | None:
    """Seconds from a preemption notice (``--preemption-notice``, a fake metadata server
    flipping ``instance/preempted``) to the last closure the coordinator sends that worker.
    ``None`` until preemption notices exist (issue 29 item 3)."""
    return None


def preemption_state_saved(state_mib: int) -> float | None:
    """Seconds to fetch ``state_mib`` MiB of ``on_preemption="save"`` device state from a
    worker that got a preemption notice. ``None`` until that option exists (item 3)."""
    return None


def coordinator_restart_to_first_closure(state_mib: int) -> float | None:
    """Seconds from SIGKILL of the coordinator's process to the first closure of the
    restarted program running on re-attached named state of ``state_mib`` MiB per worker
    (``create_per_worker_state(..., name=...)``). ``None`` until named state survives its
    coordinator (issue 29 item 2); compare it with :func:`checkpoint_round_trip`."""
    return None


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return (
        f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"
    )


def _or_pending(value: float | None, needs: str) -> str:
    return f"{value:.2f} s" if value is not None else f"- (needs {needs})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=3, help="kills per figure (default 3)")
    parser.add_argument("--state-mib", type=int, default=256, help="checkpointed state (MiB)")
    parser.add_argument(
        "--quick", action="store_true", help="1 kill each and 16 MiB of state (a smoke run)"
    )
    parser.add_argument("--no-slices", action="store_true", help="skip the slice figure")
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.state_mib = 1, 16
    reruns = worker_kill_to_rerun(args.kills)
    slices = [] if args.no_slices else slice_host_kill_to_serving(args.kills)
    saved, restored = checkpoint_round_trip(args.state_mib)
    mib = args.state_mib

    restart = coordinator_restart_to_first_closure(mib)
    rows = [
        ("worker SIGKILL -> its closure running elsewhere", _spread([r for r, _ in reruns])),
        ("worker SIGKILL -> that closure's result", _spread([d for _, d in reruns])),
        ("slice host SIGKILL -> slice serving again", _spread(slices)),
        (
            "preemption notice -> last closure sent to it",
            _or_pending(preemption_to_last_closure(), "preemption notices"),
        ),
        (
            f"{mib} MiB of on_preemption='save' state saved",
            _or_pending(preemption_state_saved(mib), "on_preemption='save'"),
        ),
        (
            "coordinator SIGKILL -> first closure, re-attached",
            _or_pending(restart, "named state that survives its coordinator"),
        ),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"recovery times ({args.kills} kill(s) per figure, {mib} MiB of state)")
    for label, value in rows:
        print(f"  {label.ljust(width)} : {value}")
    print(f"TF's coordinator restart (job restart from a checkpoint, {mib} MiB on 2 ps):")
    print(f"  strategy.save {saved:.2f} s + restore {restored:.2f} s = {saved + restored:.2f} s")
    if restart is not None:
        print(f"  re-attach / checkpoint round trip: {restart / (saved + restored):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
