"""Recovery times (issue 29 item 5): how long each interruption costs, side by side.

1. worker SIGKILL -> its closure running elsewhere: from the kill to the closure's second
   start (on another worker), and to its result.
2. slice host SIGKILL -> the slice serving again: ``LocalCluster(num_workers=4,
   hosts_per_slice=2)``, rank 1 of slice 0 killed, until the coordinator has it up with new
   processes.
3. TF's way to survive a coordinator restart, the baseline: a job restarted from a
   checkpoint, timed as a ``ParameterServerStrategy.save`` / ``restore`` round trip of
   ``--state-mib`` MiB of variables (a new strategy, as the restarted program makes).

4. preemption notice -> the last closure sent to that worker: 2 workers, a stream of short
   closures, SIGTERM to one; also how many closures were retried (the notice charges none).
5. coordinator SIGKILL -> the first closure of the restarted program on re-attached named
   state (``--state-mib`` MiB over 2 workers), split into process start + imports,
   coordinator up, re-attach and the closure; printed against the baseline (3) as a ratio.

6. ``--state-mib`` MiB of ``on_preemption="save"`` state saved: SIGTERM (a notice) to one of
   2 workers -> the copy held by the coordinator (seconds, MB/s); then the replacement,
   started on the same address, serving -> its first closure, its state built from the copy.

Usage: python benches/recovery_bench.py [--kills N] [--state-mib M] [--quick]
"""

from __future__ import annotations

import argparse
import os
import signal
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


# --- A preemption notice, and a coordinator restart on named state. ---


def stamped(directory: str, i: int, seconds: float) -> tuple[int, float]:
    """Runs on a worker: leaves ``run-<i>-<pid>`` holding its start time in ``directory``
    (every start, answered or not), sleeps ``seconds``, returns (pid, start)."""
    start = time.time()
    Path(directory, f"run-{i}-{os.getpid()}").write_text(f"{start:.6f}")
    time.sleep(seconds)
    return os.getpid(), start


def _runs(directory: Path) -> list[tuple[int, int, float]]:
    """(closure, pid, start) of every run :func:`stamped` recorded."""
    found = []
    for marker in directory.glob("run-*"):
        text = marker.read_text()
        if text:
            _, i, pid = marker.name.split("-")
            found.append((int(i), int(pid), float(text)))
    return found


def _more(coordinator: Any, values: list[Any], work: str, n: int) -> None:
    """Schedules ``n`` more :func:`stamped` closures, numbered on from ``values``."""
    first = len(values)
    values.extend(coordinator.schedule(stamped, args=(work, first + k, 0.02)) for k in range(n))


def preemption_to_last_closure(notices: int = 1) -> list[tuple[float, int, int]] | None:
    """(seconds from a preemption notice to the start of the last closure the preempted
    worker ran, negative when that one started before the notice; closures the coordinator
    counted as retried; closures that ran twice) per notice. A closure starts after it was
    sent, so this bounds the last one sent. 2 workers take a stream of 20 ms closures; the
    notice is a SIGTERM to worker 0 (``--preemption-notice signal``: what Kubernetes sends;
    a metadata server's notice takes the same path from there). The coordinator has
    ``max_closure_retries=0``, so a retry charged for the notice would fail a closure."""
    from jaxcluster import LocalCluster

    here = os.path.dirname(os.path.abspath(__file__))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    figures = []
    for _ in range(notices):
        with (
            tempfile.TemporaryDirectory() as work,
            LocalCluster(2, env=env, worker_args=("--preemption-notice", "signal")) as cluster,
            cluster.coordinator(max_closure_retries=0) as coordinator,
        ):
            preempted = cluster.worker_pid(0)
            values: list[Any] = []
            _more(coordinator, values, work, 40)
            # Both workers busy before the notice.
            if preempted is None or all(v.fetch()[0] != preempted for v in values[:20]):
                raise RuntimeError("worker 0 ran none of the first closures")
            noticed = time.time()
            os.kill(preempted, signal.SIGTERM)
            # Keep the stream going until the coordinator has counted the notice, and a while
            # after (anything it still sent worker 0 would show as a late start).
            until = None
            while until is None or time.monotonic() < until:
                _more(coordinator, values, work, 4)
                if until is None and coordinator.metrics()["preemptions"]:
                    until = time.monotonic() + 2.0
                time.sleep(0.05)
                if time.time() - noticed > 60:
                    raise TimeoutError("worker 0 never seen preempting")
            assert coordinator.join(timeout=120)
            for v in values:
                v.fetch()
            metrics = coordinator.metrics()
            if metrics["failed"]:
                raise AssertionError(f"{metrics['failed']} closure(s) failed after the notice")
            runs = _runs(Path(work))
            if {i for i, _, _ in runs} != set(range(len(values))):
                raise AssertionError("a closure never ran")
            last = max(start for _, pid, start in runs if pid == preempted)
            twice = len(runs) - len(values)
            figures.append((last - noticed, int(metrics["retried"]), twice))
    return figures


class Filled:
    """An ``init_fn``: ``mib`` MiB of float32 ones (pickled by reference: the workers
    import this module)."""

    def __init__(self, mib: int) -> None:
        self.mib = mib

    def __call__(self) -> dict[str, Any]:
        return {"w": np.full(self.mib * 1024 * 1024 // 4, 1.0, np.float32)}


def set_two(state: Any) -> int:
    """Runs on a worker: its state becomes 2.0 everywhere (``init_fn`` gives 1.0); its index."""
    from jaxcluster.coordinator import get_current_worker_index

    state.assign({"w": state.value["w"] * 0 + 2})
    return get_current_worker_index()


def last_of(state: Any) -> tuple[int, float]:
    """Runs on a worker: its index and the state's last element."""
    from jaxcluster.coordinator import get_current_worker_index

    return get_current_worker_index(), float(state.value["w"][-1])


def preemption_state_saved(state_mib: int) -> dict[str, float]:
    """``state_mib`` MiB of ``on_preemption="save"`` state on 2 workers; SIGTERM (a notice,
    30 s grace) to worker 0. ``saved``: notice -> the copy on the coordinator (seconds);
    ``mb_s``: its rate; ``first_closure``: the replacement answering on its address -> its
    first closure's result (its state built from the copy, sent back to it: it reads the
    2.0 a closure wrote before the notice, not ``init_fn``'s 1.0)."""
    from jaxcluster import LocalCluster

    here = os.path.dirname(os.path.abspath(__file__))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    with LocalCluster(2, env=env) as cluster, cluster.coordinator() as coordinator:
        state = coordinator.create_per_worker_state(Filled(state_mib), on_preemption="save")
        _wait(
            lambda: 0 in coordinator.fetch([coordinator.schedule(set_two, args=(state,))]),
            "worker 0's state set to 2.0",
            300,
        )
        pid = cluster.worker_pid(0)
        assert pid is not None
        noticed = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        _wait(lambda: state.preemption_saves.saved >= 1, "the state's save", 300)
        saved = time.monotonic() - noticed
        if state.preemption_saves.failed:
            raise AssertionError("the save failed")
        _wait(lambda: cluster.worker_pid(0) is None, "worker 0 to exit", 120)
        cluster.restart_worker(0)
        serving = time.monotonic()

        def on_zero() -> list[float]:
            values = [coordinator.schedule(last_of, args=(state,)) for _ in range(4)]
            return [last for index, last in coordinator.fetch(values) if index == 0]

        last = _wait(on_zero, "a closure on the replacement", 300)
        first_closure = time.monotonic() - serving
        if last[0] != 2.0:
            raise AssertionError(f"the replacement's state reads {last[0]}, not the copy's 2.0")
    return {
        "saved": saved,
        "mb_s": state_mib * 1024 * 1024 / 1e6 / saved,
        "first_closure": first_closure,
    }


# The program a coordinator restart runs, twice: the first instance builds named state of
# MIB MiB on every worker and runs a few closures on it, then waits to be SIGKILLed; the
# second re-attaches and runs one closure. It prints wall-clock stamps as JSON.
_RESTARTED = """
import json, sys, time
started = time.time()
import numpy as np
from jaxcluster import ClusterCoordinator
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.cluster_spec import ClusterSpec

addresses, mib, first = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3] == "first"
imported = time.time()
coordinator = ClusterCoordinator(SimpleClusterResolver(ClusterSpec({"worker": addresses})))
up = time.time()

def init():
    # init_fn running in the restarted program would show as 2.0 below.
    fill = 1.0 if first else 2.0
    return {"w": np.full(mib * 1024 * 1024 // 4, fill, np.float32), "step": np.int64(0)}

state = coordinator.create_per_worker_state(init, name="recovery-bench")
reattached = state.reattached
attached = time.time()

def step(s):
    v = s.value
    step, last, nbytes = int(v["step"]) + 1, float(v["w"][-1]), int(v["w"].nbytes)
    s.assign({"w": v["w"], "step": np.int64(step)})  # frees the old step's buffer
    return step, last, nbytes

if first:
    for _ in range(3):
        coordinator.fetch([coordinator.schedule(step, args=(state,)) for _ in addresses])
    print("READY", flush=True)
    time.sleep(600)
result = coordinator.schedule(step, args=(state,)).fetch()
done = time.time()
print(json.dumps({"started": started, "imported": imported, "up": up, "attached": attached,
                  "done": done, "reattached": reattached, "result": result}), flush=True)
coordinator.shutdown()
"""


def coordinator_restart_to_first_closure(state_mib: int) -> dict[str, float] | None:
    """Seconds from SIGKILL of the coordinator's process to the first closure of the
    restarted program on re-attached named state (``create_per_worker_state(...,
    name=...)``), ``state_mib`` MiB in all over 2 workers, and its split: process start and
    imports, coordinator up, re-attach, first closure. Compare with
    :func:`checkpoint_round_trip`, TF's way."""
    import json
    import subprocess

    from jaxcluster import LocalCluster
    from jaxcluster._auth import AUTH_TOKEN_ENV

    # The workers keep the killed coordinator's named state this long.
    with LocalCluster(2, state_ttl=600) as cluster:
        env = {**os.environ, AUTH_TOKEN_ENV: cluster.auth_token}
        per_worker = max(state_mib // cluster.num_workers, 1)

        def start(which: str) -> subprocess.Popen[str]:
            command = [sys.executable, "-c", _RESTARTED, ",".join(cluster.addresses)]
            return subprocess.Popen(
                [*command, str(per_worker), which], stdout=subprocess.PIPE, text=True, env=env
            )

        first = start("first")
        try:
            assert first.stdout is not None
            if first.stdout.readline().strip() != "READY":
                raise RuntimeError("the first coordinator program ended before READY")
            killed = time.time()
            first.kill()
            second = start("second")
        finally:
            first.kill()
            first.wait()
        out, _ = second.communicate(timeout=300)
        if second.returncode != 0:
            raise RuntimeError(f"the restarted program exited {second.returncode}")
        stamps = json.loads(out.strip().splitlines()[-1])
    step, value, nbytes = stamps["result"]
    # Re-attached (init_fn never ran in it), and the state is the killed program's: its
    # fill is there (a rebuilt value would read 2.0), and every byte of it.
    if not stamps["reattached"] or step < 1 or value != 1.0:
        raise AssertionError(f"not re-attached to the killed program's state: {stamps}")
    if nbytes != per_worker * 1024 * 1024:
        raise AssertionError(f"{nbytes} bytes of state, expected {per_worker} MiB")
    return {
        "total": stamps["done"] - killed,
        "start": stamps["imported"] - killed,
        "up": stamps["up"] - stamps["imported"],
        "reattach": stamps["attached"] - stamps["up"],
        "closure": stamps["done"] - stamps["attached"],
    }


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return (
        f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"
    )


def _spread_ms(values: list[float]) -> str:
    """Milliseconds; negative: nothing started after the notice (the last began before)."""
    if not values:
        return "-"
    ms = [v * 1000 for v in values]
    return f"median {statistics.median(ms):.0f} ms (min {min(ms):.0f}, max {max(ms):.0f})"


def _or_pending(value: float | None, needs: str) -> str:
    return f"{value:.2f} s" if value is not None else f"- (needs {needs})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=3, help="kills per figure (default 3)")
    parser.add_argument(
        "--state-mib", type=int, default=256, help="state checkpointed or re-attached (MiB)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="1 kill each and 16 MiB of state (a smoke run)"
    )
    parser.add_argument("--no-slices", action="store_true", help="skip the slice figure")
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.state_mib = 1, 16
    mib = args.state_mib
    reruns = worker_kill_to_rerun(args.kills)
    slices = [] if args.no_slices else slice_host_kill_to_serving(args.kills)
    notices = preemption_to_last_closure(args.kills) or []
    kept = preemption_state_saved(mib)
    saved, restored = checkpoint_round_trip(mib)
    restart = coordinator_restart_to_first_closure(mib)

    retried = [r for _, r, _ in notices]
    twice = sum(t for _, _, t in notices)
    rows = [
        ("worker SIGKILL -> its closure running elsewhere", _spread([r for r, _ in reruns])),
        ("worker SIGKILL -> that closure's result", _spread([d for _, d in reruns])),
        ("slice host SIGKILL -> slice serving again", _spread(slices)),
        (
            "preemption notice -> last closure sent to it",
            f"{_spread_ms([n for n, _, _ in notices])}; none charged (0 failed with"
            f" max_closure_retries=0); counted retried per run {retried}; ran twice {twice}",
        ),
        (
            f"{mib} MiB of on_preemption='save' state saved",
            f"notice -> copy on the coordinator {kept['saved']:.2f} s ({kept['mb_s']:.0f} MB/s);"
            f" replacement serving -> first closure on the copy {kept['first_closure']:.2f} s",
        ),
        (
            f"coordinator SIGKILL -> first closure, {mib} MiB re-attached",
            _or_pending(restart["total"] if restart else None, "named state"),
        ),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"recovery times ({args.kills} kill(s) per figure, {mib} MiB of state)")
    for label, value in rows:
        print(f"  {label.ljust(width)} : {value}")
    if restart is not None:
        print(
            "  coordinator restart split: process start + imports {start:.2f} s, coordinator"
            " up {up:.2f} s, re-attach {reattach:.2f} s, first closure {closure:.2f} s".format(
                **restart
            )
        )
    print(f"TF's coordinator restart (job restart from a checkpoint, {mib} MiB on 2 ps):")
    print(f"  strategy.save {saved:.2f} s + restore {restored:.2f} s = {saved + restored:.2f} s")
    if restart is not None:
        # Both restarted programs pay the process start and the coordinator coming up; what
        # differs is getting the state back: re-attaching it, or restoring the checkpoint.
        state = max(restart["reattach"] + restart["closure"], 1e-3)
        tf_restart = restart["start"] + restart["up"] + restored
        print(
            f"  state back: re-attach + first closure {state:.2f} s vs restore {restored:.2f} s"
            f" ({restored / state:.0f}x faster), vs save + restore"
            f" {(saved + restored) / state:.0f}x"
        )
        print(
            f"  whole restart: {restart['total']:.2f} s vs the same start with a restore"
            f" {tf_restart:.2f} s ({tf_restart / restart['total']:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
