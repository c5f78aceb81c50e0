"""GPU check: a CPU-only coordinator driving a worker whose JAX runs on a GPU.

What a CPU machine cannot show, measured in one run on a machine with one NVIDIA GPU:

- the worker reports its platform and devices (``coordinator.workers``) and runs closures on
  the GPU, while the coordinator process has no GPU at all (``JAX_PLATFORMS=cpu`` here);
- a ``jax.jit`` function exported by that CPU-only coordinator for ``cuda`` runs on the
  worker's GPU and gives the right values;
- arrays moved coordinator -> worker GPU -> coordinator: MiB/s for a jit round trip of
  each size, beside a plain (numpy, host-only) round trip of the same bytes in the same run,
  so the GPU's share (host <-> device copies, the kernel) shows as the difference;
- device state kept in GPU memory between closures: steps that move no bytes, the GPU
  memory it holds, and ``state.fetch`` of it (GPU -> worker host -> coordinator) checked
  value by value.

    python benches/gpu_check.py                      # worker on cuda (needs a GPU)
    python benches/gpu_check.py --worker-platform cpu --mib 16   # the same script on a CPU
    python benches/gpu_check.py --json out.json

Prints one JSON object (also written to ``--json``). Exits 1 naming any check that failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

# Before JAX loads: this process (the coordinator) must not use, or even see, a GPU.
os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np

MIB = 1 << 20


def where() -> tuple[str, str, int]:
    """Runs on the worker: the platform, kind and count of its JAX devices."""
    import jax

    device = jax.devices()[0]
    return device.platform, device.device_kind, jax.device_count()


def identity(x: np.ndarray) -> np.ndarray:
    """Runs on the worker's host: the bytes in and out, no device involved."""
    return x


def _affine(x: Any) -> Any:
    return x * 2.0 + 1.0


def _init_state(n: int) -> Any:
    def init() -> dict[str, Any]:
        import jax.numpy as jnp

        return {"w": jnp.zeros((n,), jnp.float32)}

    return init


def _step(state: Any) -> tuple[str, int]:
    """One training-like step on device state: no bytes cross the wire."""

    w = state.value["w"] + 1.0
    state.assign({"w": w})
    device = next(iter(w.devices()))
    stats = device.memory_stats() or {}
    return device.platform, int(stats.get("bytes_in_use", -1))


def _best(seconds: list[float]) -> float:
    return min(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-platform", default="cuda", help="JAX_PLATFORMS of the worker")
    parser.add_argument("--mib", type=int, default=256, help="largest array / state, MiB")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions of each round trip")
    parser.add_argument("--steps", type=int, default=50, help="device-state steps")
    parser.add_argument("--json", help="also write the results here")
    options = parser.parse_args()

    import jax

    import jaxcluster
    from jaxcluster.coordinator import ClusterCoordinator

    results: dict[str, Any] = {"coordinator_backend": jax.default_backend()}
    failures: list[str] = []
    env = {"JAX_PLATFORMS": options.worker_platform, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    started = time.perf_counter()
    with jaxcluster.LocalCluster(1, env=env) as cluster:
        results["cluster_start_s"] = round(time.perf_counter() - started, 2)
        with ClusterCoordinator(cluster.resolver, auth_token=cluster.auth_token) as coordinator:
            platform, kind, count = coordinator.schedule(where).fetch()
            status = coordinator.workers[0]
            # A typed WorkerStatus (its worker's own report in .report); a dict before 0.2.
            report = getattr(status, "report", None) or status
            results["worker"] = {
                "platform": platform,
                "device_kind": kind,
                "device_count": count,
                "reported_platform": str(report["platform"]),
                "jax_version": str(report["jax_version"]),
            }
            expected = "gpu" if options.worker_platform == "cuda" else options.worker_platform
            if platform != expected:
                failures.append(f"worker ran on {platform!r}, expected {expected!r}")

            # A jit exported here (CPU only) for the worker's platform.
            affine = jax.jit(_affine)
            x = np.arange(1024, dtype=np.float32)
            try:
                got = coordinator.schedule(affine, args=(x,)).fetch()
            except Exception as exc:  # reported, and the rest runs without it
                failures.append(f"the exported jit failed: {type(exc).__name__}: {exc}")
                affine = None
            else:
                if not np.array_equal(got, x * 2.0 + 1.0):
                    failures.append("the exported jit gave wrong values")

            # Round trips, coordinator -> worker (-> GPU) -> coordinator.
            sizes = sorted({1, 16, options.mib} & set(range(1, options.mib + 1)))
            transfers = []
            for mib in sizes:
                array = np.ones(mib * MIB // 4, np.float32)
                row: dict[str, Any] = {"mib": mib}
                for name, fn in (("jit_on_device", affine), ("host_identity", identity)):
                    if fn is None:
                        continue
                    coordinator.schedule(fn, args=(array,)).fetch()  # warm: export, caches
                    seconds = []
                    for _ in range(options.reps):
                        t0 = time.perf_counter()
                        out = coordinator.schedule(fn, args=(array,)).fetch()
                        seconds.append(time.perf_counter() - t0)
                    want = 3.0 if fn is affine else 1.0
                    if out.shape != array.shape or not (out[0] == want and out[-1] == want):
                        failures.append(f"{name} of {mib} MiB gave wrong values")
                    # Bytes both ways over the best time.
                    row[f"{name}_mib_s"] = round(2 * mib / _best(seconds), 1)
                    row[f"{name}_ms"] = round(1e3 * _best(seconds), 2)
                transfers.append(row)
            results["round_trips"] = transfers

            # Device state in GPU memory between closures.
            n = options.mib * MIB // 4
            t0 = time.perf_counter()
            state = coordinator.create_per_worker_state(_init_state(n))
            coordinator.schedule(_step, args=(state,)).fetch()  # built, one step, warm
            results_state: dict[str, Any] = {"mib": options.mib}
            results_state["built_and_first_step_s"] = round(time.perf_counter() - t0, 3)
            t0 = time.perf_counter()
            steps = [coordinator.schedule(_step, args=(state,)) for _ in range(options.steps)]
            coordinator.join()
            outs = [step.fetch() for step in steps]
            elapsed = time.perf_counter() - t0
            results_state["step_ms"] = round(1e3 * elapsed / options.steps, 3)
            results_state["array_platform"] = outs[-1][0]
            results_state["device_bytes_in_use"] = outs[-1][1]
            if outs[-1][0] != expected:
                failures.append(f"device state lives on {outs[-1][0]!r}, expected {expected!r}")
            if expected == "gpu" and outs[-1][1] < n * 4:
                failures.append(f"GPU holds {outs[-1][1]} bytes, less than the state's {n * 4}")
            t0 = time.perf_counter()
            try:
                value = state.fetch(0)
            except Exception as exc:  # reported; the figures so far still print
                failures.append(f"state.fetch failed: {type(exc).__name__}: {exc}")
            else:
                fetch_s = time.perf_counter() - t0
                results_state["fetch_ms"] = round(1e3 * fetch_s, 2)
                results_state["fetch_mib_s"] = round(options.mib / fetch_s, 1)
                want = float(options.steps + 1)
                w = value["w"]
                if w.shape != (n,) or not (w[0] == want and w[-1] == want and w.mean() == want):
                    failures.append(f"fetched state is wrong: expected every element {want}")
            results["device_state"] = results_state
            results["metrics"] = {
                key: value
                for key, value in coordinator.metrics().items()
                if key in ("completed", "failed", "retried", "worker_failures")
            }
    results["failures"] = failures
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if options.json:
        with open(options.json, "w") as out:
            out.write(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
