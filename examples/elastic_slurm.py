"""Elastic workers: the coordinator follows a resolver whose worker list changes
(``ClusterCoordinator(resolver, refresh_interval=...)``) while closures keep running.

Every ``refresh_interval`` seconds the coordinator asks the resolver again, adds the
workers it newly lists (each builds its per-worker datasets and state, then takes
closures) and drains and removes the ones it no longer lists; nothing scheduled is lost.

Locally the resolver is a ``TFConfigClusterResolver(tf_config_file=PATH)`` reading a file
this program rewrites (as a scheduler or a ConfigMap update would): 1 worker, then 3,
then 2, against a ``LocalCluster`` of 3 worker processes.

On Slurm: run the coordinator program inside an allocation and give the workers their own
job steps, so that more can be started later::

    salloc --nodes=4                       # or an sbatch script
    srun --nodes=2 --ntasks=2 jaxcluster worker --from-resolver slurm \\
        --auth-token-file ~/.jaxcluster-token &
    python my_train.py                     # ClusterCoordinator(resolver, refresh_interval=30)
    # later, more workers in the same allocation (or a new one with --jobid):
    srun --nodes=2 --ntasks=2 jaxcluster worker --auth-token-file ... &

with a resolver that lists the workers now running: ``SlurmClusterResolver`` describes
the allocation it is made in (``SLURM_*`` of one step), so for steps that come and go
write their addresses to a shared TF_CONFIG file (as here) or use a
``SimpleClusterResolver`` you update; on Kubernetes ``KubernetesClusterResolver`` follows
Running pods by itself. See "Elastic workers" in docs/coordinator.md.

Run it::

    python examples/elastic_slurm.py --small    # seconds
    python examples/elastic_slurm.py            # more closures per phase
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable

from _cluster import cluster, parse_args
from jaxcluster.cluster_resolver import TFConfigClusterResolver
from jaxcluster.coordinator import ClusterCoordinator, get_current_worker_index


def write_tf_config(path: str, workers: list[str]) -> None:
    """Replaces the file atomically, as a ConfigMap update or a scheduler would."""
    with open(path + ".new", "w") as staged:
        json.dump({"cluster": {"worker": workers}}, staged)
    os.replace(path + ".new", path)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def work(i: int) -> tuple[int, int]:
    return i * i, get_current_worker_index()


def main() -> None:
    args = parse_args(__doc__)
    per_phase = 40 if args.small else 400
    with cluster(3) as c, tempfile.TemporaryDirectory() as directory:
        if c.local is None:
            raise SystemExit("this example drives a LocalCluster; see its docstring for Slurm")
        addresses = c.local.addresses
        path = os.path.join(directory, "tf_config.json")
        write_tf_config(path, addresses[:1])
        resolver = TFConfigClusterResolver(tf_config_file=path)
        with ClusterCoordinator(
            resolver, auth_token=c.auth_token, refresh_interval=0.2
        ) as coordinator:

            def up() -> list[int]:
                return [i for i, w in enumerate(coordinator.workers) if w.state == "up"]

            def run_phase(name: str) -> set[int]:
                values = [coordinator.schedule(work, args=(i,)) for i in range(per_phase)]
                results = coordinator.fetch(values)
                assert [r[0] for r in results] == [i * i for i in range(per_phase)]
                ran_on = {r[1] for r in results}
                print(f"{name}: workers up {up()}, {per_phase} closures ran on {sorted(ran_on)}")
                return ran_on

            run_phase("1 worker")
            write_tf_config(path, addresses)  # two more workers appear
            wait_until(lambda: len(up()) == 3, "the two new workers joined")
            grown = len(up())
            run_phase("3 workers")
            write_tf_config(path, addresses[1:])  # worker 0 leaves
            wait_until(lambda: coordinator.workers[0].state == "removed", "worker 0 left")
            shrunk = run_phase("2 workers")
            print(
                f"RESULT grew to {grown} workers, shrank to {len(up())}; "
                f"closures on removed worker 0: {int(0 in shrunk)}"
            )


if __name__ == "__main__":
    main()
