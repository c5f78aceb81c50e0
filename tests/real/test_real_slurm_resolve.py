"""SlurmClusterResolver inside real srun steps: every layout compared with where Slurm
really placed each task, tasks binding what the spec says, and explain()."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from jaxcluster._native import core
from support.slurm import NODES, SlurmCluster, find_cluster

# Without a cluster this module is one skip, with the reason (an error in CI).
find_cluster()


def _check_layout(records: list[dict[str, Any]], num_tasks: int) -> list[str]:
    """Every task agrees on the spec, and the spec puts each rank where Slurm did."""
    assert [r["rank"] for r in records] == list(range(num_tasks)), records
    errors = [r["error"] for r in records if "error" in r]
    assert not errors, errors
    specs = {repr(r["spec"]) for r in records}
    assert len(specs) == 1, f"tasks disagree on the cluster spec: {specs}"
    workers = records[0]["spec"]["worker"]
    assert len(workers) == num_tasks and len(set(workers)) == num_tasks, workers
    for record in records:
        host, port = workers[record["rank"]].rsplit(":", 1)
        assert host == record["node"], (record["rank"], workers, record["node"])
        assert int(port) == 8888 + int(record["localid"]), (record, workers)
        assert record["address"] == workers[record["rank"]]
        assert record["task"] == ["worker", record["rank"]]
        assert record["environment"] == "slurm"
    return [w.split(":")[0] for w in workers]


@pytest.mark.parametrize(
    ("options", "expected_nodes"),
    [
        (["-N2", "-n4"], ["n1", "n1", "n2", "n2"]),
        (["-N2", "--ntasks-per-node=2"], ["n1", "n1", "n2", "n2"]),
        (["-N4", "-n7"], ["n1", "n1", "n2", "n2", "n3", "n3", "n4"]),  # uneven
        (["-N3", "-n5", "-m", "cyclic"], ["n1", "n2", "n3", "n1", "n2"]),
        (["-N3", "-n5", "-m", "block:cyclic"], ["n1", "n1", "n2", "n2", "n3"]),
        (["-N3", "-n8", "-O", "-m", "cyclic"], ["n1", "n2", "n3"] * 2 + ["n1", "n2"]),
        (
            ["-N3", "-n8", "-O", "-m", "plane=3"],
            ["n1", "n1", "n1", "n2", "n2", "n2", "n3", "n1"],
        ),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) and "-N" in value[0] else None,
)
def test_resolve_matches_where_slurm_placed_each_task(
    slurm: SlurmCluster, options: list[str], expected_nodes: list[str]
) -> None:
    records = slurm.probe(["-w", "n[1-4]" if "-N4" in options else "n[1-3]", *options], "resolve")
    assert _check_layout(records, len(expected_nodes)) == expected_nodes


def test_a_heterogeneous_step_is_resolved_block_by_block(slurm: SlurmCluster) -> None:
    records = slurm.probe(["-w", "n1", "-n1", ":", "-w", "n2", "-n2"], "resolve")
    assert _check_layout(records, 3) == ["n1", "n2", "n2"]


def test_arbitrary_distribution_is_refused_naming_the_option(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n2\nn1\nn2\n")
    records = slurm.probe(
        ["-n3", "-m", "arbitrary"], "resolve", env={"SLURM_HOSTFILE": str(hostfile)}
    )
    assert [r["node"] for r in records] == ["n2", "n1", "n2"]  # Slurm did follow the file
    for record in records:
        assert "--distribution=arbitrary" in record.get("error", ""), record


def test_explain_inside_a_step_names_public_classes_and_the_jax_port(slurm: SlurmCluster) -> None:
    [first, *_] = slurm.probe(["-N2", "-n2"], "resolve")
    text = first["explain"]
    assert "resolver SlurmClusterResolver" in text
    assert "rpc_layer='grpc' from the SlurmClusterResolver default" in text
    assert f"coordinator port from SLURM_JOB_ID={first['job_id']}" in text
    assert not re.search(r"\b_[A-Z]\w+", text) and "default of rpc_layer" not in text, text
    port = int(first["job_id"]) % 4096 + 61440
    assert first["jax"]["coordinator_address"] == f"{first['node']}:{port}"  # rank 0's node


def test_cyclic_workers_bind_the_addresses_the_spec_gives_them(slurm: SlurmCluster) -> None:
    """`jaxcluster worker --from-resolver slurm` in a cyclic step: each task binds its own
    node's address (two nodes share this machine and the ports), and answers as its rank."""
    token = "real-slurm-token"
    name = slurm.unique_name()
    step = subprocess.Popen(
        [
            "srun",
            f"--job-name={name}",
            "--time=5",
            "-w",
            "n[1-2]",
            "-N2",
            "-n4",
            "-m",
            "cyclic",
            "--label",
            "--kill-on-bad-exit=1",
            "jaxcluster",
            "worker",
            "--from-resolver",
            "slurm",
        ],
        env=slurm.environment({"JAXCLUSTER_AUTH_TOKEN": token}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert step.stdout is not None
        listening: dict[int, str] = {}
        lines: list[str] = []
        deadline = time.monotonic() + 120
        while len(listening) < 4 and time.monotonic() < deadline:
            line = step.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.match(r"(\d+): jaxcluster worker listening on (\S+)", line)
            if match:
                listening[int(match.group(1))] = match.group(2)
        assert len(listening) == 4, "".join(lines)
        # cyclic over n1, n2: ranks 0, 2 on n1 and 1, 3 on n2, each node's in port order;
        # n1 and n2 share this machine and the ports, apart by address only.
        placed = [("n1", 8888), ("n2", 8888), ("n1", 8889), ("n2", 8889)]
        assert listening == {r: f"{NODES[n]}:{p}" for r, (n, p) in enumerate(placed)}
        for rank, (node, port) in enumerate(placed):
            status = core.WorkerClient(f"{NODES[node]}:{port}", auth_token=token).get_status()
            assert status["worker_index"] == rank
        slurm.scancel("--signal=TERM", "--name", name)
        rest, _ = step.communicate(timeout=60)
        assert step.returncode == 0, "".join(lines) + rest  # every worker exited 0
    finally:
        if step.poll() is None:
            slurm.scancel("--name", name)
            step.kill()
            step.communicate()
