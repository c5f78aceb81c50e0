"""Serial latency against Ray Compiled Graphs and Ray tasks, and where the time goes.

Two local workers run a trivial ``f(x) = x + 1``. For jaxcluster, Ray's Compiled Graph (an
actor method compiled as a one-node graph with ``experimental_compile()``) and a plain Ray
task, in interleaved repetitions of the same run: sequential schedule -> fetch round trips
(p50, p99, mean) and closures/s with many in flight. A second jaxcluster, in processes of
its own, runs beside the first with ``JAXCLUSTER_SPIN_US`` set (``--second-spin-us``,
default 0: the spin off, against this process's default), or with the environment
``--second-env NAME=VALUE`` gives it (``JAXCLUSTER_RUNTIME_LEND=0``: the runtime keeps its
own thread). Each side's serial round trips
follow the same warm-up (:data:`WARM_UP_S`). Ray's graph is compiled for each of its
repetitions and torn down after it, since its actor polls on a core of its own while the
graph is compiled, even idle, and must not do so under the other sides' repetitions.
Then, for jaxcluster only:

- where a round trip's time goes, hop by hop: the closure returns ``time.monotonic_ns()``
  taken on the worker as it starts and ends (``CLOCK_MONOTONIC`` is one clock for every
  process on the host), and the coordinator stamps the same clock around ``schedule()``,
  the parked wait and the decode; a second pass polls ``RemoteValue.done()`` instead of
  parking, which stamps when the result cell is settled and so splits "back to the
  coordinator" from "the fetching thread's wake-up";
- how many times each thread sleeps and is woken per round trip (voluntary context
  switches from ``/proc/<pid>/task/<tid>/status``);
- idle CPU over 5 s with nothing scheduled (``/proc/<pid>/stat`` ticks, and wake-ups/s
  from the context switches; Linux only): of the coordinator and of each worker, and of
  every side's processes together (Ray's: the driver, ``gcs_server``, ``raylet`` and the
  actors below it, with the graph compiled).

A TCP echo of 16 bytes between two Python processes (``tcp_echo.py``) runs in the same
repetitions: the floor of a round trip with one wake-up each way.

Ray is never a dependency of jaxcluster: it runs in a virtualenv of its own, as a child
process (this same file with ``--ray-child``) that answers in JSON. Make that virtualenv
once::

    python3 -m venv .venv/ray && .venv/ray/bin/pip install 'ray[default]'

then::

    python benches/latency_bench.py --ray-python .venv/ray/bin/python
    python benches/latency_bench.py --ray-python .venv/ray/bin/python --perf  # root:
        # also who wakes whom per round trip and each thread's scheduling delay (perf sched)
    python benches/latency_bench.py                   # jaxcluster only (Ray skipped)
    python benches/latency_bench.py --reps 5 -n 3000

Build the extension optimized first (``maturin develop --release`` or ``--profile ci``).
The machine may be shared: read the ratios (same run, interleaved) and the load printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from thread_wakeups import idle_cpu, perf_sched, tree_idle_cpu, wakeups_per_round_trip

WORKERS = 2
IN_FLIGHT_CG = 8  # Ray compiled graphs bound executions in flight; 8 is what issue 26 used
_MARK = "LATENCY-BENCH "


# Defined here, so they are pickled by value (workers cannot import the benches folder).
def add_one(x: int) -> int:
    return x + 1


def add_one_stamped(x: int) -> tuple[int, int, int]:
    import time as clock

    started = clock.monotonic_ns()
    y = x + 1
    return y, started, clock.monotonic_ns()


def summary(ns: list[int]) -> dict[str, float]:
    """p50, p99 and mean of round trips given in nanoseconds, in microseconds."""
    ordered = sorted(ns)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "p50_us": statistics.median(ordered) / 1e3,
        "p99_us": p99 / 1e3,
        "mean_us": statistics.fmean(ordered) / 1e3,
    }


#: Each side's serial round trips follow this long a warm-up, the same for every side. A
#: Ray Compiled Graph just compiled runs at about twice its settled latency for its first
#: 0.1-0.4 s (measured on the 2-core machine: 75-85 us, then 33 us).
WARM_UP_S = 1.0


def serial(call: Callable[[int], Any], n: int) -> dict[str, float]:
    """``n`` sequential round trips after a warm-up (:data:`WARM_UP_S`, and at least 200
    round trips); their latency summary."""
    until = time.perf_counter() + WARM_UP_S
    i = 0
    while i < 200 or time.perf_counter() < until:
        call(i)
        i += 1
    took = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        call(i)
        took.append(time.perf_counter_ns() - t0)
    return summary(took)


# ---------------------------------------------------------------------------------- Ray child


def ray_child() -> int:
    """Runs in Ray's virtualenv: answers each stdin line with a JSON line, ``N_SERIAL
    N_MANY`` with its figures and ``idle SECONDS`` with the CPU its processes use meanwhile.

    The graph is compiled for each line and torn down after it: a compiled graph's actor
    polls its input channel on a core of its own while it waits (``idle`` measures that),
    which must not run under the other side's repetitions."""
    import ray
    from ray.dag import InputNode

    ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)

    @ray.remote
    class Adder:
        def f(self, x: int) -> int:
            return x + 1

    @ray.remote
    def task(x: int) -> int:
        return x + 1

    actor = Adder.remote()  # type: ignore[attr-defined]

    def compiled() -> Any:
        with InputNode() as given:
            dag = actor.f.bind(given)
        try:
            return dag.experimental_compile(_max_inflight_executions=IN_FLIGHT_CG)
        except TypeError:  # a Ray without the knob
            return dag.experimental_compile()

    print(_MARK + json.dumps({"ray": ray.__version__}), flush=True)
    for line in sys.stdin:
        command, *numbers = line.split()
        graph = compiled()
        try:
            ray.get(graph.execute(0))
            if command == "idle":
                print(_MARK + json.dumps({"idle": tree_idle_cpu(os.getpid(), float(numbers[0]))}))
                sys.stdout.flush()
                continue
            n_serial, n_many = int(command), int(numbers[0])
            cg = serial(lambda i, g=graph: ray.get(g.execute(i)), n_serial)
            started = time.perf_counter()
            done = 0
            while done < n_many:
                ray.get([graph.execute(i) for i in range(IN_FLIGHT_CG)])
                done += IN_FLIGHT_CG
            cg["rate"] = done / (time.perf_counter() - started)
        finally:
            graph.teardown()
        plain = serial(lambda i: ray.get(task.remote(i)), max(200, n_serial // 4))
        started = time.perf_counter()
        ray.get([task.remote(i) for i in range(max(1000, n_many // 10))])
        plain["rate"] = max(1000, n_many // 10) / (time.perf_counter() - started)
        print(_MARK + json.dumps({"cg": cg, "task": plain}), flush=True)
    ray.shutdown()
    return 0


def jaxcluster_child() -> int:
    """Another jaxcluster (a coordinator and its workers) with the ``JAXCLUSTER_SPIN_US``
    the parent set: it is read once per process, so the variant needs processes of its own.
    Answers stdin lines as :func:`ray_child` does."""
    from jaxcluster import LocalCluster

    with LocalCluster(WORKERS) as cluster, cluster.coordinator() as coordinator:
        pids = {"coordinator": os.getpid()}
        pids.update({f"worker {i}": cluster.worker_pid(i) for i in range(WORKERS)})
        print(_MARK + json.dumps({"spin_us": os.environ.get("JAXCLUSTER_SPIN_US")}), flush=True)
        for line in sys.stdin:
            command, *numbers = line.split()
            if command == "idle":
                used = idle_cpu(pids, float(numbers[0]))
                answer = {"idle": {process: pct for process, (pct, _) in used.items()}}
            else:
                answer = {"jc2": jaxcluster_rep(coordinator, int(command), int(numbers[0]))}
            print(_MARK + json.dumps(answer), flush=True)
    return 0


class Child:
    """A side measured in a process of its own, alive across repetitions so it starts once."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.hello = self._answer()

    def _answer(self) -> dict:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK) :])
        raise RuntimeError(f"{self._proc.args} exited ({self._proc.wait()}) without answering")

    def ask(self, line: str) -> dict:
        assert self._proc.stdin is not None
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        return self._answer()

    def run(self, n_serial: int, n_many: int) -> dict:
        return self.ask(f"{n_serial} {n_many}")

    def idle(self, seconds: float = 5.0) -> dict[str, float]:
        return self.ask(f"idle {seconds}")["idle"]

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()


# ---------------------------------------------------------------------------- jaxcluster side


def echo_rep(port: int, n_serial: int) -> dict:
    """The floor: serial round trips of 16 bytes over a TCP echo between two Python
    processes (one wake-up each way, no framing, no queue)."""
    from tcp_echo import EchoClient

    client = EchoClient(port)
    payload = bytes(16)
    try:
        return serial(lambda i: client.round_trip(payload), n_serial)
    finally:
        client.close()


def jaxcluster_rep(coordinator: Any, n_serial: int, n_many: int) -> dict:
    """One repetition: serial round trips, then closures/s with ``n_many`` in flight."""
    result = serial(lambda i: coordinator.schedule(add_one, args=(i,)).fetch(), n_serial)
    started = time.perf_counter()
    values = [coordinator.schedule(add_one, args=(i,)) for i in range(n_many)]
    coordinator.join()
    values[-1].fetch()
    result["rate"] = n_many / (time.perf_counter() - started)
    return result


HOPS = (
    (
        "schedule() called -> f starts on the worker: encode, queue, link task wake-up, "
        "stream write, loopback, worker reader, job queue, executor wake-up, decode",
        "out",
    ),
    ("f(x) on the worker", "run"),
    (
        "f returns -> fetching thread runs again: result encode, worker writer, loopback, "
        "coordinator reader, cell settled, fetching thread's wake-up",
        "back",
    ),
    ("result() and decode in fetch()", "decode"),
)


def hop_profile(coordinator: Any, n: int) -> dict[str, float]:
    """Median microseconds per hop of a serial round trip (see ``HOPS``), and more."""
    clock = time.monotonic_ns
    parked: dict[str, list[int]] = {key: [] for key in ("out", "run", "back", "decode")}
    parked.update(total=[], returned=[])
    polled: list[int] = []
    for i in range(200):
        coordinator.schedule(add_one_stamped, args=(i,)).fetch()
    for i in range(n):
        # The fetching thread parks as fetch() does.
        t0 = clock()
        rv = coordinator.schedule(add_one_stamped, args=(i,))
        t1 = clock()
        rv._wait(None)
        t2 = clock()
        _, w0, w1 = rv.fetch()
        t3 = clock()
        for key, value in (
            ("out", w0 - t0),
            ("run", w1 - w0),
            ("back", t2 - w1),
            ("decode", t3 - t2),
            ("total", t3 - t0),
            ("returned", t1 - t0),
        ):
            parked[key].append(value)
        # The fetching thread polls done() instead (what an unbounded spin would give).
        t0 = clock()
        rv = coordinator.schedule(add_one_stamped, args=(i,))
        while not rv.done():
            pass
        rv.fetch()
        polled.append(clock() - t0)
    med = {key: statistics.median(values) / 1e3 for key, values in parked.items()}
    med["polled_total"] = statistics.median(polled) / 1e3
    # The tail: each hop's median over the slowest 1% of round trips.
    slowest = sorted(range(n), key=parked["total"].__getitem__)[-max(1, n // 100) :]
    for key, values in parked.items():
        med[f"tail_{key}"] = statistics.median(values[i] for i in slowest) / 1e3
    # What schedule() itself costs: a burst with nothing fetched, per call.
    started = clock()
    burst = [coordinator.schedule(add_one_stamped, args=(i,)) for i in range(n)]
    med["schedule_cpu"] = (clock() - started) / n / 1e3
    coordinator.join()
    del burst
    return med


# ------------------------------------------------------------------------------------ report


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def report(reps: list[dict], ray_version: str | None, second: str | None) -> None:
    print("\nmedian (min-max) of the repetitions")
    rows = [("p50 us", "p50_us"), ("p99 us", "p99_us"), ("mean us", "mean_us")]
    rows.append(("closures/s, many", "rate"))
    sides = [("jaxcluster", "jc")]
    if second is not None:
        sides.append((second, "jc2"))
    if ray_version:
        sides += [(f"Ray {ray_version} CG", "cg"), ("Ray task", "task")]
    width = max(26, *(len(name) + 2 for name, _ in sides))
    print(f"{'':<18}" + "".join(f"{name:>{width}}" for name, _ in sides))
    for label, key in rows:
        cells = [spread([r[side][key] for r in reps]) for _, side in sides]
        print(f"{label:<18}" + "".join(f"{cell:>{width}}" for cell in cells))
    for key in ("p50_us", "p99_us"):
        echo = [r["echo"][key] for r in reps]
        ratios = [r["jc"][key] / r["echo"][key] for r in reps]
        print(
            f"TCP echo of 16 bytes between 2 Python processes, {key[:-3]}: {spread(echo)} us;"
            f" jaxcluster / echo: median {statistics.median(ratios):.2f}"
        )
    if not ray_version:
        print("Ray skipped: pass --ray-python PATH (see this file's docstring for the venv)")
        return
    for name, side in sides[: 1 if second is None else 2]:
        for key in ("p50_us", "p99_us", "mean_us"):
            ratios = [r[side][key] / r["cg"][key] for r in reps]
            print(
                f"ratio {name} / Ray CG, {key[:-3]}: median {statistics.median(ratios):.2f}"
                f" (per repetition: {', '.join(f'{v:.2f}' for v in ratios)})"
            )
        ratios = [r[side]["rate"] / r["cg"]["rate"] for r in reps]
        print(f"ratio closures/s, {name} / Ray CG: median {statistics.median(ratios):.1f}")


def report_idle(idle: dict[str, dict[str, float]]) -> None:
    """Idle CPU of each side, all of its processes together, and its busiest process."""
    print("\nidle, 5 s after the last round trip, every process of the side together")
    for side, used in idle.items():
        name, most = max(used.items(), key=lambda kv: kv[1])
        print(f"  {side:<36} {sum(used.values()):>6.1f}% of a core  (busiest: {name}, {most:.1f}%)")


def report_hops(hops: list[dict[str, float]]) -> None:
    def med(key: str) -> float:
        return statistics.median(h[key] for h in hops)

    print("\nwhere the remaining time goes (serial round trip, median us per hop; then the")
    print("same over the slowest 1% of round trips, where p99 lives)")
    for label, key in HOPS:
        print(f"  {med(key):>7.1f}  {med('tail_' + key):>8.1f}  {label}")
    total, tail = med("total"), med("tail_total")
    print(f"  {total:>7.1f}  {tail:>8.1f}  total (parked fetch, as fetch() does)")
    print(f"  {med('polled_total'):>7.1f}  total when the fetching thread polls done() instead")
    print(
        f"  schedule() returned {med('returned'):.1f} us after it was called; it costs "
        f"{med('schedule_cpu'):.1f} us per call in a burst (the rest: preempted by what it woke)"
    )


def report_sched(sched: dict | None) -> None:
    if sched is None:
        print("\nperf sched: not run (needs perf and root; pass --perf)")
        return
    print("\nperf sched, per serial round trip: switch-ins, us runnable after a wake-up, us run")
    total = 0.0
    for (process, thread), (count, delay, run) in sorted(sched["threads"].items()):
        if count >= 0.05:
            total += delay
            print(f"  {process:<12} {thread:<24} {count:>5.2f} {delay:>7.1f} {run:>7.1f}")
    print(f"  scheduling delay per round trip, all threads: {total:.1f} us")
    print("wake-ups per serial round trip, waker -> wakee")
    for key, count in sorted(sched["wakes"].items(), key=lambda kv: -kv[1]):
        if count >= 0.05:
            print(f"  {count:>5.2f}  {key}")
    print(f"  {sum(sched['wakes'].values()):>5.2f}  in all")


def report_wakeups(moved: dict, n: int) -> None:
    print(f"\ncontext switches per serial round trip ({n:,} round trips; vol = slept and woken)")
    print(f"  {'process':<12} {'thread':<18} {'vol':>6} {'invol':>6} {'CPU us':>7}")
    total = 0.0
    for (process, thread), (vol, invol, cpu) in sorted(moved.items()):
        if vol + invol >= 0.05 * n:
            total += vol / n
            print(
                f"  {process:<12} {thread:<18} {vol / n:>6.2f} {invol / n:>6.2f}"
                f" {cpu / n * 1e6:>7.1f}"
            )
    print(f"  voluntary wake-ups per round trip, all threads: {total:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ray-python", metavar="PATH", help="python of a venv with ray>=2.40")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("-n", type=int, default=2000, help="serial round trips per repetition")
    parser.add_argument("--many", type=int, default=20_000, help="closures in the burst")
    parser.add_argument("--perf", action="store_true", help="perf sched the round trip (root)")
    parser.add_argument(
        "--second-spin-us",
        default="0",
        metavar="US",
        help="also a jaxcluster of its own processes with JAXCLUSTER_SPIN_US=US (default 0: "
        "the spin off, beside this process's default; '' skips it)",
    )
    parser.add_argument(
        "--second-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="the second jaxcluster's environment instead of --second-spin-us (repeatable), "
        "e.g. JAXCLUSTER_RUNTIME_LEND=0 for the runtime keeping its own thread",
    )
    parser.add_argument("--ray-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--jaxcluster-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ray_child:
        return ray_child()
    if args.jaxcluster_child:
        return jaxcluster_child()
    from jaxcluster import LocalCluster
    from tcp_echo import EchoServer

    print(f"load average at start: {os.getloadavg()}, cores: {os.cpu_count()}")
    ray = Child([args.ray_python, __file__, "--ray-child"]) if args.ray_python else None
    other = second = None
    if args.second_env:
        if not all("=" in item for item in args.second_env):
            parser.error(f"--second-env takes NAME=VALUE, got {args.second_env}")
        second = "jaxcluster, " + " ".join(args.second_env)
        env = {**os.environ, **dict(item.split("=", 1) for item in args.second_env)}
        other = Child([sys.executable, __file__, "--jaxcluster-child"], env)
    elif args.second_spin_us:
        second = f"jaxcluster, JAXCLUSTER_SPIN_US={args.second_spin_us}"
        env = {**os.environ, "JAXCLUSTER_SPIN_US": args.second_spin_us}
        other = Child([sys.executable, __file__, "--jaxcluster-child"], env)
    reps: list[dict] = []
    hops: list[dict[str, float]] = []
    idle: dict[str, dict[str, float]] = {}
    try:
        with (
            EchoServer() as port,
            LocalCluster(WORKERS) as cluster,
            cluster.coordinator() as coordinator,
        ):
            pids = {"coordinator": os.getpid()}
            pids.update({f"worker {i}": cluster.worker_pid(i) for i in range(WORKERS)})
            for rep in range(args.reps):
                row = {"jc": jaxcluster_rep(coordinator, args.n, args.many)}
                row["echo"] = echo_rep(port, args.n)
                for child in (other, ray):
                    if child is not None:
                        row.update(child.run(args.n, args.many))
                hops.append(hop_profile(coordinator, args.n // 2))
                reps.append(row)
                print(f"repetition {rep + 1}: " + json.dumps(row))

            def round_trip(i: int) -> Any:
                return coordinator.schedule(add_one, args=(i,)).fetch()

            moved = wakeups_per_round_trip(round_trip, pids, args.n)
            sched = None
            if args.perf:
                with tempfile.TemporaryDirectory() as folder:
                    sched = perf_sched(round_trip, pids, args.n // 2, folder)
            round_trip(0)
            used = idle_cpu(pids)
            idle["jaxcluster"] = {process: pct for process, (pct, _) in used.items()}
            if other is not None and second is not None:
                idle[second] = other.idle()
            if ray is not None:
                idle["Ray CG (graph compiled)"] = ray.idle()
    finally:
        for child in (other, ray):
            if child is not None:
                child.close()
    report(reps, ray.hello["ray"] if ray is not None else None, second)
    report_hops(hops)
    report_wakeups(moved, args.n)
    report_sched(sched)
    print("\nidle, 5 s with nothing scheduled (/proc/<pid>/stat ticks, context switches)")
    for process, (pct, wakes) in sorted(used.items()):
        print(f"  {process:<12} {pct:>5.1f}% of a core, {wakes:>6.0f} wake-ups/s")
    report_idle(idle)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
