"""A sharded ``jax.jit`` on a 4-device worker (forced CPU devices) vs the same function
called locally on 4 devices: the coordinator's overhead per closure.

Both sides run the same computation on the same kind of devices, so the difference is what
jaxcluster adds: serializing the arguments, the round trip, placing the inputs with the
exported shardings on the worker, and bringing the result back.

Usage: python benches/sharded_bench.py [--closures N] [--size ROWS]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcluster import LocalCluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--closures", type=int, default=2000)
    parser.add_argument("--size", type=int, default=256, help="rows of the float32 input")
    args = parser.parse_args()

    mesh = Mesh(np.array(jax.devices()), ("d",))
    f = jax.jit(
        lambda x: jnp.sum(jnp.tanh(x @ x.T), axis=0),
        in_shardings=NamedSharding(mesh, P("d")),
        out_shardings=NamedSharding(mesh, P()),
    )
    x = np.random.default_rng(0).normal(size=(args.size, 64)).astype(np.float32)

    def local_call() -> None:
        np.asarray(f(x))  # to host, as a fetch does

    for _ in range(50):
        local_call()
    local = []
    for _ in range(args.closures):
        start = time.perf_counter()
        local_call()
        local.append(time.perf_counter() - start)

    env = {"XLA_FLAGS": os.environ["XLA_FLAGS"]}
    with LocalCluster(2, env=env) as cluster, cluster.coordinator() as coordinator:
        for _ in range(50):
            coordinator.schedule(f, args=(x,)).fetch()
        remote = []
        for _ in range(args.closures):
            start = time.perf_counter()
            coordinator.schedule(f, args=(x,)).fetch()
            remote.append(time.perf_counter() - start)
        start = time.perf_counter()
        values = [coordinator.schedule(f, args=(x,)) for _ in range(args.closures)]
        coordinator.fetch(values)
        pipelined = args.closures / (time.perf_counter() - start)

    local_us = statistics.median(local) * 1e6
    remote_us = statistics.median(remote) * 1e6
    print(f"input float32[{args.size}, 64] sharded over 4 devices; {args.closures} closures")
    print(f"local call (4 devices, result to host)  p50 {local_us:8.1f} us")
    print(f"closure round trip (1 in flight)        p50 {remote_us:8.1f} us")
    print(f"overhead per closure                        {remote_us - local_us:8.1f} us")
    print(f"closures/s with many in flight (2 workers)  {pipelined:8.0f}")


if __name__ == "__main__":
    main()
