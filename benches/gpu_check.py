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
  value by value;
- kept results (``keep_result=True``) on the GPU: a chain of closures each reading the last
  one's kept array where it lies, beside fetching and resending it every step; a fan-in
  whose smaller input is pulled from the other worker's GPU peer to peer; and ``fetch()`` of
  a kept GPU array, each checked value by value.

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


def _kept_ones(directory: str, mib: int, parties: int) -> Any:
    """Runs on a worker: a kept array of ones on its device, once ``parties`` producers have
    started (so two of them land on two workers)."""
    import pathlib

    import jax.numpy as jnp

    folder = pathlib.Path(directory)
    (folder / str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(folder.iterdir())) < parties and time.monotonic() < deadline:
        time.sleep(0.005)
    return jnp.ones((mib * MIB // 4,), jnp.float32)


def _bump(x: Any) -> Any:
    return x + 1.0


def _platform_of(x: Any) -> str:
    """Runs on a worker: where an input arrived (a numpy input says ``host``)."""
    devices = getattr(x, "devices", None)
    return next(iter(devices())).platform if callable(devices) else "host"


def _fan_in(big: Any, small: Any) -> tuple[str, str, float]:
    import jax.numpy as jnp

    return _platform_of(big), _platform_of(small), float(jnp.sum(big) + jnp.sum(small))


def _peer_bytes(cluster: Any) -> dict[int, tuple[int, int]]:
    """Each worker's ``GetStatus`` peer-to-peer byte counts: (sent, received)."""
    from jaxcluster._native import core

    out = {}
    for index, address in enumerate(cluster.addresses):
        client = core.WorkerClient(address, auth_token=cluster.auth_token)
        report = client.get_status(timeout=10.0)
        out[index] = (int(report["peer_bytes_sent"]), int(report["peer_bytes_received"]))
    return out


def kept_on_device(
    coordinator: Any, cluster: Any, mib: int, steps: int, expected: str, failures: list[str]
) -> dict[str, Any]:
    """Kept results in the workers' device memory: a chain, a fan-in pulled peer to peer
    and a fetch, timed and checked (see the module docstring)."""
    import tempfile

    import jax

    out: dict[str, Any] = {"mib": mib, "steps": steps}
    n = mib * MIB // 4
    bump = jax.jit(_bump)
    with tempfile.TemporaryDirectory() as barrier:
        first = coordinator.schedule(_kept_ones, args=(barrier, mib, 1), keep_result=True)
        first.fetch()  # warm both paths: export, caches
        coordinator.schedule(bump, args=(first,), keep_result=True).fetch()
        holder = coordinator.schedule(_platform_of, args=(first,)).fetch()
        out["kept_array_platform"] = holder
        if holder != expected:
            failures.append(f"a kept array lives on {holder!r}, expected {expected!r}")
        t0 = time.perf_counter()
        value = first
        for _ in range(steps):
            value = coordinator.schedule(bump, args=(value,), keep_result=True)
        assert value.nbytes == n * 4  # waits for the last
        chain_s = time.perf_counter() - t0
        out["chain_step_ms"] = round(1e3 * chain_s / steps, 3)
        t0 = time.perf_counter()
        got = value.fetch()
        fetch_s = time.perf_counter() - t0
        out["fetch_ms"] = round(1e3 * fetch_s, 2)
        out["fetch_mib_s"] = round(mib / fetch_s, 1)
        if got.shape != (n,) or not (got[0] == 1 + steps and got[-1] == 1 + steps):
            failures.append(f"the kept chain is wrong: expected every element {1 + steps}")
        # The same steps with the array fetched and sent again each time.
        t0 = time.perf_counter()
        resent = np.ones(n, np.float32)
        resend_steps = max(2, steps // 10)
        for _ in range(resend_steps):
            resent = coordinator.schedule(bump, args=(resent,)).fetch()
        out["fetch_and_resend_step_ms"] = round(1e3 * (time.perf_counter() - t0) / resend_steps, 3)
        out["chain_speedup"] = round(out["fetch_and_resend_step_ms"] / out["chain_step_ms"], 1)
    if len(cluster.addresses) >= 2:
        with tempfile.TemporaryDirectory() as barrier:
            small = coordinator.schedule(_kept_ones, args=(barrier, mib // 4, 2), keep_result=True)
            big = coordinator.schedule(_kept_ones, args=(barrier, mib, 2), keep_result=True)
            assert small.nbytes and big.nbytes  # both made
            before = _peer_bytes(cluster)
            t0 = time.perf_counter()
            where_big, where_small, total = coordinator.schedule(_fan_in, args=(big, small)).fetch()
            out["fan_in_ms"] = round(1e3 * (time.perf_counter() - t0), 2)
            after = _peer_bytes(cluster)
            pulled = sum(after[i][1] - before[i][1] for i in after)
            out["fan_in"] = {
                "holders": [small.worker, big.worker],
                "big_input_on": where_big,
                "pulled_input_on": where_small,
                "peer_bytes_pulled": pulled,
            }
            want = float((mib + mib // 4) * MIB // 4)
            if total != want:
                failures.append(f"the fan-in summed {total}, expected {want}")
            if where_small != expected:
                failures.append(
                    f"a kept array pulled from the other worker arrived on {where_small!r}, "
                    f"expected {expected!r} (as on its holder)"
                )
            if small.worker != big.worker and pulled < (mib // 4) * MIB:
                failures.append(
                    f"the fan-in pulled {pulled} bytes peer to peer, expected the small input's"
                )
    return out


def _best(seconds: list[float]) -> float:
    return min(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-platform", default="cuda", help="JAX_PLATFORMS of the worker")
    parser.add_argument("--mib", type=int, default=256, help="largest array / state, MiB")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions of each round trip")
    parser.add_argument("--steps", type=int, default=50, help="device-state steps")
    parser.add_argument("--workers", type=int, default=2, help="workers (sharing the GPU)")
    parser.add_argument("--json", help="also write the results here")
    options = parser.parse_args()

    import jax

    import jaxcluster
    from jaxcluster.coordinator import ClusterCoordinator

    results: dict[str, Any] = {"coordinator_backend": jax.default_backend()}
    failures: list[str] = []
    env = {"JAX_PLATFORMS": options.worker_platform, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    started = time.perf_counter()
    with jaxcluster.LocalCluster(options.workers, env=env) as cluster:
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
                values = [state.fetch(i) for i in range(options.workers)]
            except Exception as exc:  # reported; the figures so far still print
                failures.append(f"state.fetch failed: {type(exc).__name__}: {exc}")
            else:
                fetch_s = time.perf_counter() - t0
                results_state["fetch_ms"] = round(1e3 * fetch_s / options.workers, 2)
                results_state["fetch_mib_s"] = round(options.workers * options.mib / fetch_s, 1)
                # Each worker's state counts the steps it ran; together, every step.
                ws = [value["w"] for value in values]
                uniform = all(w.shape == (n,) and w.min() == w.max() for w in ws)
                total = sum(float(w[0]) for w in ws)
                if not uniform or total != options.steps + 1:
                    failures.append(
                        f"fetched state is wrong: the workers' counts add up to {total}, "
                        f"expected {options.steps + 1} steps"
                    )
            results["device_state"] = results_state
            del state
            try:
                results["kept"] = kept_on_device(
                    coordinator, cluster, options.mib, options.steps, expected, failures
                )
            except Exception as exc:  # reported; the figures so far still print
                failures.append(f"kept results failed: {type(exc).__name__}: {exc}")
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
