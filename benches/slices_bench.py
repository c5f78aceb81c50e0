"""Multi-host slices on this machine: what SPMD dispatch costs, how long a slice takes to
serve again after one host is SIGKILLed, and a cross-host psum inside a closure against the
same psum in plain ``jax.distributed`` processes.

1. Round trip (p50 of sequential schedule+fetch) and closures/s (a batch scheduled, then
   joined) of a trivial closure: 2 slices of 2 hosts vs 2 single-host workers (1 CPU
   device per process in both).
2. SIGKILL of one host (rank 1 of slice 0) to that slice serving again with new
   processes, as the coordinator sees it (the link's time in state ``up``).
3. A ``psum`` of ``--psum-mib`` MiB per host across the 2 hosts of a slice, timed inside
   the closure (median of 5 after a warm-up), vs 2 plain processes that call
   ``jax.distributed.initialize`` and run the same jit (the baseline).

Usage: python benches/slices_bench.py [--closures N] [--kills K] [--psum-mib M]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

HOSTS = 2


def trivial() -> int:
    return 1


def timed_psum(mib: int, repeats: int = 5) -> float:
    """Runs on every host of a slice (or a baseline process): median seconds of a jit whose
    result is the sum over hosts of a ``mib`` MiB float32 block per device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("d",))
    n = mib * 1024 * 1024 // 4
    rows = NamedSharding(mesh, P("d"))
    x = jax.make_array_from_callback(
        (jax.device_count(), n), rows, lambda idx: np.ones((1, n), np.float32)
    )
    reduce = jax.jit(lambda a: jnp.sum(a, axis=0), out_shardings=NamedSharding(mesh, P()))
    reduce(x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = reduce(x)
        out.block_until_ready()
        times.append(time.perf_counter() - start)
    assert float(out.addressable_data(0)[0]) == jax.device_count()
    return statistics.median(times)


def _dispatch(coordinator: Any, closures: int) -> tuple[float, float]:
    for _ in range(50):
        coordinator.schedule(trivial).fetch()
    trips = []
    for _ in range(closures):
        start = time.perf_counter()
        coordinator.schedule(trivial).fetch()
        trips.append(time.perf_counter() - start)
    start = time.perf_counter()
    values = [coordinator.schedule(trivial) for _ in range(closures * 5)]
    coordinator.join()
    rate = len(values) / (time.perf_counter() - start)
    assert sum(coordinator.fetch(values)) == len(values)
    return statistics.median(trips), rate


def _recovery(cluster: Any, coordinator: Any) -> float:
    from jaxcluster.demos.slices import wait_serving_again

    before = coordinator.workers[0]["incarnation"]
    cluster.kill_worker(1)
    recovered = wait_serving_again(coordinator, before, time.monotonic(), timeout=300)
    if recovered is None:
        raise TimeoutError("slice 0 did not serve again within 300 s")
    return recovered


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _baseline(mib: int) -> float:
    """The same psum in 2 plain jax.distributed processes; rank 0's median."""
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--baseline-rank",
                str(r),
                "--port",
                str(port),
                "--psum-mib",
                str(mib),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        for r in range(HOSTS)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"baseline processes failed: {[p.returncode for p in procs]}")
    return float(outs[0].strip().splitlines()[-1])


def _baseline_rank(rank: int, port: int, mib: int) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=HOSTS, process_id=rank)
    print(timed_psum(mib), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--closures", type=int, default=500)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--psum-mib", type=int, default=64)
    parser.add_argument("--baseline-rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_rank is not None:
        _baseline_rank(args.baseline_rank, args.port, args.psum_mib)
        return

    from jaxcluster import LocalCluster

    here = os.path.dirname(os.path.abspath(__file__))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    with LocalCluster(2, env=env, devices_per_host=1) as plain, plain.coordinator() as c:
        plain_trip, plain_rate = _dispatch(c, args.closures)
    with (
        LocalCluster(
            2 * HOSTS,
            hosts_per_slice=HOSTS,
            devices_per_host=1,
            env=env,
            worker_args=["--slice-heartbeat-timeout", "5"],
        ) as sliced,
        sliced.coordinator() as c,
    ):
        slice_trip, slice_rate = _dispatch(c, args.closures)
        # One at a time: two slices reducing at once would share this machine's cores.
        psum = statistics.median(
            c.schedule(timed_psum, args=(args.psum_mib,)).fetch() for _ in range(3)
        )
        recoveries = [_recovery(sliced, c) for _ in range(args.kills)]
    baseline = _baseline(args.psum_mib)

    print(f"trivial closure, {args.closures} sequential round trips, {args.closures * 5} batched")
    print(f"  2 workers x 1 host : p50 {plain_trip * 1e3:.2f} ms, {plain_rate:,.0f} closures/s")
    print(
        f"  2 slices x {HOSTS} hosts: p50 {slice_trip * 1e3:.2f} ms, {slice_rate:,.0f} closures/s"
    )
    print(
        f"  slices/workers     : round trip {slice_trip / plain_trip:.2f}x, "
        f"throughput {slice_rate / plain_rate:.2f}x"
    )
    print(
        "SIGKILL of one host -> slice serving again: " + ", ".join(f"{r:.2f} s" for r in recoveries)
    )
    print(f"psum of {args.psum_mib} MiB per host across {HOSTS} hosts (median of 5, in-process)")
    print(f"  inside a closure   : {psum * 1e3:.1f} ms")
    print(f"  plain jax.distributed: {baseline * 1e3:.1f} ms  (ratio {psum / baseline:.2f}x)")


if __name__ == "__main__":
    main()
