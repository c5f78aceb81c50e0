"""Synchronous data-parallel training across multi-host slices (multislice).

A slice is a group of hosts that run one SPMD program together through
``jax.distributed`` (a TPU pod slice, or GPU hosts joined by NVLink/InfiniBand). Here each
round sends one step to every slice: on a slice, every host feeds its own rows into a
global batch sharded over all the slice's devices, and a ``jax.jit`` computes the
gradient with a cross-host all-reduce inside the slice. The coordinator then averages
the slices' gradients (the all-reduce *across* slices, over the data-center network in
real multislice training) and applies them, so all slices train one model.

Locally: ``LocalCluster(num_workers=4, hosts_per_slice=2, devices_per_host=2)``, 2 slices
of 2 host processes with 2 CPU devices each (gloo collectives between the processes).
On a real cluster each host runs ``jaxcluster worker --slice-size K ...`` (or
``--from-resolver gce_tpu_vm`` on a multi-host TPU VM) and the coordinator is made with
``ClusterCoordinator(resolver, hosts_per_slice=K)``; see docs/slices.md.

Run it::

    python examples/multislice.py --small    # 2 slices x 2 hosts x 2 CPU devices, 8 rounds
    python examples/multislice.py            # the same cluster, 60 rounds
"""

from __future__ import annotations

import numpy as np

from _cluster import cluster, parse_args
from jaxcluster.coordinator import ClusterCoordinator

HOSTS_PER_SLICE, SLICES, DEVICES = 2, 2, 2
DIM = 8
TARGET = np.linspace(-2.0, 2.0, DIM).astype(np.float32)


def loss(params, x, y):
    import jax.numpy as jnp

    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def slice_step(params, round_index: int, rows_per_host: int):
    """Runs on every host of one slice: the slice-wide loss and gradient."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxcluster.coordinator import get_current_worker_index

    mesh = Mesh(np.array(jax.devices()), ("data",))  # every device of every host of the slice
    replicated, by_row = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    # Each host makes its own rows: different per slice, per host and per round.
    host = get_current_worker_index() * HOSTS_PER_SLICE + jax.process_index()
    rng = np.random.default_rng([round_index, host])
    x = rng.normal(size=(rows_per_host, DIM)).astype(np.float32)
    y = x @ TARGET + 0.5
    gx = jax.make_array_from_process_local_data(by_row, x)
    gy = jax.make_array_from_process_local_data(by_row, y)
    gp = {
        k: jax.make_array_from_callback(v.shape, replicated, lambda idx, v=v: v[idx])
        for k, v in params.items()
    }
    value, grads = jax.jit(jax.value_and_grad(loss), out_shardings=replicated)(gp, gx, gy)
    return value, grads, jax.process_count(), jax.device_count()


def main() -> None:
    args = parse_args(__doc__)
    rounds, rows = (8, 32) if args.small else (60, 256)
    with (
        cluster(
            SLICES * HOSTS_PER_SLICE, hosts_per_slice=HOSTS_PER_SLICE, devices_per_host=DEVICES
        ) as c,
        ClusterCoordinator(
            c.resolver, auth_token=c.auth_token, hosts_per_slice=HOSTS_PER_SLICE
        ) as coordinator,
    ):
        print(f"slices: {coordinator.slices}")
        params = {"w": np.zeros(DIM, np.float32), "b": np.zeros((), np.float32)}
        losses = []
        for r in range(rounds):
            steps = [
                coordinator.schedule(slice_step, args=(params, r * SLICES + s, rows))
                for s in range(SLICES)
            ]
            results = coordinator.fetch(steps)
            processes, devices = results[0][2], results[0][3]
            # The cross-slice all-reduce: average the slices' gradients.
            grads = {
                k: np.mean([np.asarray(g[k]) for _, g, _, _ in results], axis=0) for k in params
            }
            params = {k: params[k] - 0.1 * grads[k] for k in params}
            losses.append(float(np.mean([float(v) for v, _, _, _ in results])))
            if r == 0:
                print(f"each step ran on {processes} hosts and {devices} devices")
        print(f"w {np.round(params['w'], 2)} target {TARGET}")
        print(f"RESULT loss {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
