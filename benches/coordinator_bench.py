"""End-to-end coordinator benchmark: jaxcluster vs a pure-Python grpcio baseline.

Two local workers; trivial closures (no arguments, return ``None``) and small-array closures
(a 64-float array in, doubled out). For each: closures/s with one closure in flight (and
the schedule -> fetch latency percentiles), and closures/s with many in flight; for
trivial closures also the rate sustained over several seconds of continuous scheduling
(the figure the 20,000/s target is checked against). The
baseline is TF's coordinator design in pure Python over plain grpcio
(``grpc_baseline.py``), driven the same way.

    python benches/coordinator_bench.py            # build with `maturin develop --release`
    python benches/coordinator_bench.py --quick
    python benches/coordinator_bench.py --sustain 30  # longer steady-state run
    python benches/coordinator_bench.py --profile  # cProfile of the many-in-flight run

Targets: >= 20,000 trivial closures/s sustained, p50 <= 300 us, p99 <= 2 ms, and >= 5x the
baseline's throughput.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpc_baseline import baseline_cluster

WORKERS = 2


def trivial() -> None:
    return None


def small_array(a: np.ndarray) -> np.ndarray:
    return a * 2


WORKLOADS: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "trivial": (trivial, ()),
    "small-array": (small_array, (np.ones(64, np.float32),)),
}


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def one_in_flight(schedule: Callable[..., Any], fn: Any, args: tuple[Any, ...], n: int) -> dict:
    for _ in range(min(200, n)):  # warm up: connections, registration, caches
        schedule(fn, args).fetch()
    latencies = []
    started = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        schedule(fn, args).fetch()
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    return {
        "rate": n / elapsed,
        "p50_us": _percentile(latencies, 50) * 1e6,
        "p99_us": _percentile(latencies, 99) * 1e6,
    }


def many_in_flight(
    schedule: Callable[..., Any], join: Callable[[], Any], fn: Any, args: tuple[Any, ...], n: int
) -> dict:
    schedule(fn, args).fetch()
    started = time.perf_counter()
    values = [schedule(fn, args) for _ in range(n)]
    scheduled = time.perf_counter()
    join()
    values[-1].fetch()
    elapsed = time.perf_counter() - started
    return {"rate": n / elapsed, "schedule_rate": n / (scheduled - started)}


def sustained(
    schedule: Callable[..., Any],
    join: Callable[[], Any],
    fn: Any,
    args: tuple[Any, ...],
    seconds: float,
) -> dict:
    """Schedule without pause for ``seconds``, then join: the rate the whole path sustains.

    RemoteValues are dropped as soon as they are made, as a long training loop would, so the
    run measures steady state (queue full, every worker busy) rather than a burst into an
    empty queue.
    """
    schedule(fn, args).fetch()
    count = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(500):
            schedule(fn, args)
        count += 500
    join()
    return {"rate": count / (time.perf_counter() - started), "count": count}


def run_jaxcluster(sizes: dict[str, int], profile: bool) -> dict[str, dict]:
    from jaxcluster import LocalCluster

    results: dict[str, dict] = {}
    with LocalCluster(WORKERS) as cluster, cluster.coordinator() as coordinator:

        def schedule(fn: Any, args: tuple[Any, ...]) -> Any:
            return coordinator.schedule(fn, args=args)

        for name, (fn, args) in WORKLOADS.items():
            single = one_in_flight(schedule, fn, args, sizes["single"])
            if profile and name == "trivial":
                profiler = cProfile.Profile()
                profiler.enable()
            many = many_in_flight(schedule, coordinator.join, fn, args, sizes["many"])
            if profile and name == "trivial":
                profiler.disable()
                pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(15)
            latency = coordinator.metrics()["latency"]
            results[name] = {"single": single, "many": many, "latency": latency}
            if name == "trivial" and sizes["sustain_s"]:
                results[name]["sustained"] = sustained(
                    schedule, coordinator.join, fn, args, sizes["sustain_s"]
                )
    return results


def run_baseline(sizes: dict[str, int]) -> dict[str, dict]:
    results: dict[str, dict] = {}
    with baseline_cluster(WORKERS) as coordinator:
        print(f"baseline queue: {coordinator.queue_name}")
        for name, (fn, args) in WORKLOADS.items():
            single = one_in_flight(coordinator.schedule, fn, args, sizes["single"])
            many = many_in_flight(coordinator.schedule, coordinator.join, fn, args, sizes["many"])
            results[name] = {"single": single, "many": many}
            if name == "trivial" and sizes["sustain_s"]:
                results[name]["sustained"] = sustained(
                    coordinator.schedule, coordinator.join, fn, args, sizes["sustain_s"]
                )
    return results


def report(ours: dict[str, dict], base: dict[str, dict]) -> None:
    print(f"{'workload':<12} {'mode':<16} {'jaxcluster':>14} {'baseline':>14} {'ratio':>8}")
    for name in WORKLOADS:
        rows = [
            ("1 in flight/s", ours[name]["single"]["rate"], base[name]["single"]["rate"]),
            ("many in flight/s", ours[name]["many"]["rate"], base[name]["many"]["rate"]),
            ("p50 latency us", ours[name]["single"]["p50_us"], base[name]["single"]["p50_us"]),
            ("p99 latency us", ours[name]["single"]["p99_us"], base[name]["single"]["p99_us"]),
        ]
        if "sustained" in ours[name] and "sustained" in base[name]:
            rows.insert(
                2,
                ("sustained/s", ours[name]["sustained"]["rate"], base[name]["sustained"]["rate"]),
            )
        for mode, a, b in rows:
            ratio = a / b if "/s" in mode else b / a
            print(f"{name:<12} {mode:<16} {a:>14,.0f} {b:>14,.0f} {ratio:>7.1f}x")
        print(f"{name:<12} {'schedule()/s':<16} {ours[name]['many']['schedule_rate']:>14,.0f}")
    trivial = ours["trivial"]
    steady = trivial.get("sustained", trivial["many"])["rate"]
    checks = [
        (">= 20,000 trivial closures/s", steady >= 20_000),
        ("p50 <= 300 us", trivial["single"]["p50_us"] <= 300),
        ("p99 <= 2 ms", trivial["single"]["p99_us"] <= 2000),
        (
            ">= 5x baseline",
            steady >= 5 * base["trivial"].get("sustained", base["trivial"]["many"])["rate"],
        ),
    ]
    for label, ok in checks:
        print(f"target {label:<30} {'met' if ok else 'MISSED'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer closures per run")
    parser.add_argument("--profile", action="store_true", help="cProfile the coordinator side")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument(
        "--sustain",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="length of the sustained trivial-closure run (0 to skip)",
    )
    args = parser.parse_args()
    sustain_s = 0.0 if args.quick else args.sustain
    sizes = {"single": 2000, "many": 40_000, "sustain_s": sustain_s}
    base_sizes = {"single": 2000, "many": 10_000, "sustain_s": sustain_s}
    if args.quick:
        sizes = {"single": 500, "many": 5000, "sustain_s": 0.0}
        base_sizes = {"single": 500, "many": 2000, "sustain_s": 0.0}
    ours = run_jaxcluster(sizes, args.profile)
    if args.skip_baseline:
        for name, result in ours.items():
            print(name, result)
        return 0
    report(ours, run_baseline(base_sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
