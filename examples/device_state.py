"""Training on multi-device hosts with ``create_per_worker_state``: the parameters live on
each worker's devices and never cross the wire.

Every worker holds its own replica of the parameters (``DeviceState``), placed with a
``NamedSharding`` over all its local devices; a closure receives its worker's state,
runs a ``jax.jit`` step whose batch is split over the devices (data parallel inside the
host), and replaces the state in place. Only the batch seed goes out and only the loss
comes back. At the end ``state.fetch()`` brings each worker's parameters here once.
(Each worker trains its own replica, as in local SGD without averaging; average them with
a closure per worker, or keep shared parameters on ps tasks, to combine them.)

Locally each worker is given N forced CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=N`` through
``LocalCluster(devices_per_host=N)``); on GPU or TPU hosts the devices are real.

Run it::

    python examples/device_state.py --small    # seconds: 2 workers x 2 CPU devices
    python examples/device_state.py            # 2 workers x 4 CPU devices, more steps
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from _cluster import cluster, parse_args
from jaxcluster.coordinator import ClusterCoordinator

DIM = 32


def init_params():
    """Runs on each worker: the parameters, replicated over its local devices."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.local_devices()), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    return {"w": jax.device_put(jnp.zeros((DIM,), jnp.float32), replicated)}


def train_step(state, seed: int, batch: int) -> tuple[float, int]:
    """Runs on a worker: one data-parallel SGD step over its devices; returns the loss
    and how many devices took part."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.local_devices()
    mesh = Mesh(np.array(devices), ("data",))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, DIM)).astype(np.float32)
    y = x @ np.linspace(-1.0, 1.0, DIM, dtype=np.float32)
    sharded = NamedSharding(mesh, PartitionSpec("data"))
    x, y = jax.device_put(x, sharded), jax.device_put(y, sharded)

    @jax.jit
    def step(params, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"] - y) ** 2))(params)
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss

    new_params, loss = step(state.value, x, y)
    state.assign(new_params)
    return float(loss), len(new_params["w"].sharding.device_set)


def main() -> None:
    args = parse_args(__doc__)
    devices, steps, batch = (2, 40, 64) if args.small else (4, 400, 256)
    with (
        cluster(2, devices_per_host=devices) as c,
        ClusterCoordinator(c.resolver, auth_token=c.auth_token) as coordinator,
    ):
        state = coordinator.create_per_worker_state(init_params)
        results = [
            coordinator.schedule(train_step, args=(state, seed, batch)) for seed in range(steps)
        ]
        coordinator.join()
        # Each worker's own report (it answered by now: it ran closures).
        counts = [w.report.device_count if w.report else None for w in coordinator.workers]
        print("devices per worker:", counts)
        losses = [r.fetch()[0] for r in results]
        used = {r.fetch()[1] for r in results}
        print(f"devices used per step: {sorted(used)}")
        trained = state.fetch()  # one pytree of numpy arrays per worker
        target = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)
        errors = [float(np.abs(p["w"] - target).max()) for p in trained]
        print(f"max |w - target| per worker: {[round(e, 3) for e in errors]}")
        window = max(1, steps // 10)
        print(f"RESULT loss {np.mean(losses[:window]):.4f} -> {np.mean(losses[-window:]):.4f}")


if __name__ == "__main__":
    main()
