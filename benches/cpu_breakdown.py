"""Where the CPU goes per closure: microseconds of CPU per trivial closure, by process and
thread, while a coordinator keeps two local workers busy with many closures in flight.

Wall-clock rates swing with whatever else the machine runs; CPU time per closure does not
much, so this is the number to compare between two builds on a shared machine.

    python benches/cpu_breakdown.py            # 20,000 trivial closures
    python benches/cpu_breakdown.py -n 50000 --workload small-array
    python benches/cpu_breakdown.py -n 20000 --workload 64kib     # 64 KiB in and out

Linux only (reads ``/proc/<pid>/task/<tid>/stat``).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

_TICK = os.sysconf("SC_CLK_TCK")


# Defined here rather than imported from coordinator_bench, so they are pickled by value
# (workers cannot import the benches directory).
def trivial() -> None:
    return None


def small_array(a: np.ndarray) -> np.ndarray:
    return a * 2


WORKLOADS: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "trivial": (trivial, ()),
    "small-array": (small_array, (np.ones(64, np.float32),)),
    "64kib": (small_array, (np.ones(16 * 1024, np.float32),)),
    "256kib": (small_array, (np.ones(64 * 1024, np.float32),)),
}


def thread_times(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) per thread name of process ``pid``."""
    totals: dict[str, float] = collections.defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        totals[name] += (int(fields[11]) + int(fields[12])) / _TICK
    return totals


def snapshot(pids: dict[str, int]) -> dict[tuple[str, str], float]:
    return {
        (process, thread): seconds
        for process, pid in pids.items()
        for thread, seconds in thread_times(pid).items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20_000, help="closures to run")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="trivial")
    args = parser.parse_args()
    from jaxcluster import LocalCluster

    fn, fn_args = WORKLOADS[args.workload]
    with LocalCluster(2) as cluster, cluster.coordinator() as coordinator:
        for _ in range(2000):  # warm up: connections, registration, caches
            coordinator.schedule(fn, args=fn_args)
        coordinator.join()
        pids = {"coordinator": os.getpid()}
        pids.update({f"worker {i}": cluster.worker_pid(i) for i in range(2)})
        before = snapshot(pids)
        started = time.perf_counter()
        values: list[Any] = [coordinator.schedule(fn, args=fn_args) for _ in range(args.n)]
        coordinator.join()
        values[-1].fetch()
        elapsed = time.perf_counter() - started
        after = snapshot(pids)
    print(f"{args.n:,} {args.workload} closures in {elapsed:.2f} s: {args.n / elapsed:,.0f}/s")
    by_process: dict[str, float] = collections.defaultdict(float)
    rows = []
    for key, seconds in after.items():
        used = seconds - before.get(key, 0.0)
        by_process[key[0]] += used
        if used > 0:
            rows.append((key, used))
    print(f"{'process':<12} {'thread':<18} {'us/closure':>10}")
    for (process, thread), used in sorted(rows, key=lambda r: (r[0][0], -r[1])):
        print(f"{process:<12} {thread:<18} {used / args.n * 1e6:>10.1f}")
    total = sum(by_process.values())
    for process, used in sorted(by_process.items()):
        print(f"{process:<12} {'(all)':<18} {used / args.n * 1e6:>10.1f}")
    print(f"{'everything':<12} {'':<18} {total / args.n * 1e6:>10.1f}")
    print(f"CPU use: {total / elapsed * 100:.0f}% of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
