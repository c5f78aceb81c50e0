"""deploy/slurm/jaxcluster-ps.sbatch end to end on the real cluster: trains to the target,
checkpoints, every task exits 0; resumes after its ps step is cancelled; and a process
squatting on a node's port gets no token and fails the job fast, naming the node."""

from __future__ import annotations

import re
import shutil
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from support.slurm import NODES, RECIPE, SlurmCluster, find_cluster

TARGET = [1.0, -2.0, 3.0, 0.5]

# Without a cluster this module is one skip, with the reason (an error in CI).
find_cluster()


def _submit(slurm: SlurmCluster, where: Path, **settings: str) -> str:
    # Submitted from a directory outside the repository, by absolute path, with the
    # example program found next to the script and a checkpoint in the submit directory.
    env = {"SHARED_DIR": str(where), "PYTHON": slurm.python, **settings}
    return slurm.sbatch(RECIPE, ["-N4"], env=env, cwd=where)


def _final_weights(output: str) -> list[float]:
    match = re.search(r"^weights \[([^\]]*)\] target", output, re.MULTILINE)
    assert match, output
    return [float(x) for x in match.group(1).split()]


def _no_secrets_left(where: Path) -> None:
    assert not list(where.glob(".jaxcluster-*")), "the job's token and CA were not removed"


def test_the_recipe_trains_checkpoints_and_every_task_exits_0(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = _submit(slurm, tmp_path, EPOCHS="3")
    done = slurm.wait_job(job, tmp_path)
    out = done.output
    assert (done.state, done.exit_code) == ("COMPLETED", "0:0"), out
    assert "2 ps and 2 workers listening with TLS on port 8888" in out
    losses = [float(x) for x in re.findall(r"^epoch \d+: loss (\S+),", out, re.MULTILINE)]
    assert len(losses) == 3 and losses[-1] < losses[0] / 100, out
    np.testing.assert_allclose(_final_weights(out), TARGET, atol=1e-3)
    assert (tmp_path / f"jaxcluster-{job}.ckpt").stat().st_size > 0
    assert "ps step (n1,n2) exited with status 0" in out, out
    assert "worker step (n3,n4) exited with status 0" in out, out
    assert "srun: error" not in out and "Traceback" not in out, out
    _no_secrets_left(tmp_path)


def test_the_recipe_resumes_after_its_ps_step_is_cancelled(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "run.ckpt"
    first = _submit(slurm, tmp_path, EPOCHS="500", CHECKPOINT=str(checkpoint))
    slurm.wait_output(first, tmp_path, r"^epoch 1: ")
    steps = slurm.run(["squeue", "-h", "-s", "-j", first, "-o", "%i %j"]).stdout
    [ps_step] = [line.split()[0] for line in steps.splitlines() if line.split()[1:] == ["ps"]]
    started = time.monotonic()
    slurm.scancel(ps_step)
    failed = slurm.wait_job(first, tmp_path, timeout=120)
    assert failed.state == "FAILED" and failed.exit_code != "0:0", failed.output
    assert time.monotonic() - started < 60, "the job took long to notice its ps step died"
    assert re.search(r"ps step|parameter server task", failed.output), failed.output
    last_epoch = max(int(e) for e in re.findall(r"^epoch (\d+): ", failed.output, re.MULTILINE))

    second = _submit(slurm, tmp_path, EPOCHS=str(last_epoch + 3), CHECKPOINT=str(checkpoint))
    done = slurm.wait_job(second, tmp_path)
    assert (done.state, done.exit_code) == ("COMPLETED", "0:0"), done.output
    resumed = re.search(r"^resumed from .* at step (\d+)", done.output, re.MULTILINE)
    assert resumed, done.output
    step = int(resumed.group(1))
    assert step % 100 == 0 and step >= (last_epoch + 1) * 100, (step, last_epoch)
    epochs = [int(e) for e in re.findall(r"^epoch (\d+): ", done.output, re.MULTILINE)]
    assert epochs == list(range(step // 100, last_epoch + 3)), done.output
    np.testing.assert_allclose(_final_weights(done.output), TARGET, atol=1e-3)
    _no_secrets_left(tmp_path)


class Squatter:
    """A process-local listener on a node's port that records every byte sent to it."""

    def __init__(self, host: str, port: int) -> None:
        self.received = bytearray()
        self.connections = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.settimeout(2.0)
            try:
                while chunk := conn.recv(65536):
                    self.received += chunk
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


def test_a_port_squatter_gets_no_token_and_the_job_fails_naming_its_node(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    try:
        squatter = Squatter(NODES["n3"], 8888)  # n3 will be worker 0
    except OSError as exc:
        pytest.fail(f"cannot hold n3's port 8888 for the test: {exc}")
    try:
        started = time.monotonic()
        job = _submit(slurm, tmp_path, EPOCHS="3")
        done = slurm.wait_job(job, tmp_path, timeout=120)
        elapsed = time.monotonic() - started
    finally:
        squatter.close()
    out = done.output
    assert done.state == "FAILED" and done.exit_code != "0:0", out
    assert "jaxcluster-ps: error: the worker step on n3,n4 ended" in out, out
    assert "srun: error: n3: task 0: Exited with exit code 2" in out, out
    assert "Address already in use" in out, out
    assert elapsed < 60, f"failing took {elapsed:.0f} s"  # not the 300 s startup wait
    # Whatever reached the squatter (nothing, or a TLS handshake) carries no token.
    assert b"authorization" not in squatter.received.lower(), squatter.received[:200]
    assert b"Bearer" not in squatter.received, squatter.received[:200]
    assert not (tmp_path / f"jaxcluster-{job}.ckpt").exists()
    _no_secrets_left(tmp_path)


def test_a_task_that_never_listens_fails_the_job_naming_it(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # A `jaxcluster` that hangs instead of serving for the worker on n4 (as one stuck on a
    # slow file system would), in front of the real one on the PATH.
    shim = tmp_path / "bin"
    shim.mkdir()
    real = shutil.which("jaxcluster", path=slurm.env["PATH"])
    assert real is not None
    (shim / "jaxcluster").write_text(
        "#!/bin/bash\n"
        "if [[ $1 == worker && $SLURMD_NODENAME == n4 ]]; then exec sleep 600; fi\n"
        f'exec {real} "$@"\n'
    )
    (shim / "jaxcluster").chmod(0o755)
    started = time.monotonic()
    job = _submit(
        slurm, tmp_path, EPOCHS="3", STARTUP_TIMEOUT="8", PATH=f"{shim}:{slurm.env['PATH']}"
    )
    done = slurm.wait_job(job, tmp_path, timeout=120)
    out = done.output
    assert done.state == "FAILED", out
    assert "not listening after STARTUP_TIMEOUT=8s: worker 1 on n4" in out, out
    assert time.monotonic() - started < 60
    _no_secrets_left(tmp_path)
