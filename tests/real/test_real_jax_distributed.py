"""jaxcluster.initialize() where users run it: srun, mpirun, mpirun inside sbatch, two Slurm
jobs sharing a node; and Slurm's own GPU binding under --gpus-per-task."""

from __future__ import annotations

import collections
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from support.slurm import PROBE, SlurmCluster, find_cluster, records

# Without a cluster this module is one skip, with the reason (an error in CI).
find_cluster()


def _check_gathered(found: list[dict[str, Any]], count: int) -> None:
    """Every process got a distinct id and the same all-gather of every process's value."""
    assert [r["rank"] for r in found] == list(range(count)), found
    assert sorted(r["process_index"] for r in found) == list(range(count))
    expected = [i * 10 + 7 for i in range(count)]
    for record in found:
        assert record["process_count"] == count and record["args"]["num_processes"] == count
        assert record["gathered"] == expected, record
    assert len({r["args"]["coordinator_address"] for r in found}) == 1


def test_srun_four_tasks_initialize_and_all_gather(slurm: SlurmCluster) -> None:
    found = slurm.probe(["-n", "4"], "allgather")
    _check_gathered(found, 4)
    for record in found:
        assert record["args"]["process_id"] == record["rank"]  # Slurm's rank is JAX's id
        port = int(record["job_id"]) % 4096 + 61440
        assert record["args"]["coordinator_address"] == f"{found[0]['node']}:{port}"


def test_mpirun_two_ranks_initialize_and_all_gather(slurm: SlurmCluster) -> None:
    found = slurm.probe(["-n", "2"], "allgather", launcher=["mpirun"], timeout=180)
    _check_gathered(found, 2)
    assert all(record["node"] is None for record in found)  # no Slurm around
    assert found[0]["args"]["coordinator_address"].startswith("127.0.0.1:")


def test_mpirun_inside_sbatch_is_one_open_mpi_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    """4 ranks on 2 nodes: the ranks also see the srun step mpirun used for its daemons
    (2 tasks), which must not be taken for their job."""
    with tempfile.TemporaryDirectory(prefix="jaxcluster-probe-") as directory:
        script = tmp_path / "mpi.sbatch"
        script.write_text(
            "#!/bin/bash\n"
            f"export PROBE_DIR={directory}\n"
            f"mpirun -n 4 {sys.executable} {PROBE} allgather\n"
        )
        job = slurm.sbatch(script, ["-N2", "--ntasks-per-node=2"], cwd=tmp_path)
        done = slurm.wait_job(job, tmp_path, timeout=240)
        assert (done.state, done.exit_code) == ("COMPLETED", "0:0"), done.output
        found = records(Path(directory))
    _check_gathered(found, 4)
    per_node = collections.Counter(r["node"] for r in found)
    assert sorted(per_node.values()) == [2, 2], per_node  # two ranks on each of two nodes


def test_two_jobs_sharing_their_first_node_both_initialize(slurm: SlurmCluster) -> None:
    """Two 2-task jobs on n1 and n2 at once, each coordinator alive while the other starts:
    each job's coordinator port comes from its own job id, so neither takes the other's."""
    with (
        tempfile.TemporaryDirectory(prefix="jaxcluster-rendezvous-") as rendezvous,
        tempfile.TemporaryDirectory(prefix="jaxcluster-probe-") as out_a,
        tempfile.TemporaryDirectory(prefix="jaxcluster-probe-") as out_b,
    ):
        results: dict[str, subprocess.CompletedProcess[str]] = {}

        def job(label: str, out: str) -> None:
            results[label] = slurm.srun(
                ["-w", "n[1-2]", "-N2", "-n2"],
                [sys.executable, str(PROBE), "allgather", rendezvous, "4"],
                env={"PROBE_DIR": out},
                timeout=240,
            )

        threads = [threading.Thread(target=job, args=a) for a in (("a", out_a), ("b", out_b))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for label, result in results.items():
            assert result.returncode == 0, f"job {label}:\n{result.stdout}\n{result.stderr}"
        jobs = [records(Path(out_a)), records(Path(out_b))]
    coordinators = []
    for found in jobs:
        _check_gathered(found, 2)
        assert [r["node"] for r in found] == ["n1", "n2"]
        port = int(found[0]["job_id"]) % 4096 + 61440
        coordinators.append(found[0]["args"]["coordinator_address"])
        assert coordinators[-1] == f"n1:{port}"
    assert coordinators[0] != coordinators[1], coordinators


def test_gpus_per_task_keeps_the_gpu_slurm_bound(slurm: SlurmCluster) -> None:
    found = slurm.probe(["-w", "n[1-2]", "-N2", "-n4", "--gpus-per-task=1"], "gpus")
    by_node: dict[str, list[str]] = {}
    for record in found:
        assert record["before"] not in (None, ""), record  # Slurm bound a (fake) GPU
        assert record["after"] == record["before"], record  # and the resolver kept it
        assert record["binding"] == "CUDA_VISIBLE_DEVICES"
        assert record["accelerators"] == {"GPU": 1}
        by_node.setdefault(record["node"], []).append(record["before"])
    # Each task on a node got its own GPU.
    assert all(sorted(gpus) == ["0", "1"] for gpus in by_node.values()), by_node
