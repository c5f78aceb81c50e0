"""Slurm's `--signal` as a preemption notice on the real cluster: a batch job asks for
SIGUSR1 100 s before its 3-minute time limit, its step runs `jaxcluster worker
--preemption-signal USR1`, and the worker takes it as a notice (source, signal, deadline),
drains and exits 0 before the limit (its log says so; the job completes, not TIMEOUT)."""

from __future__ import annotations

import re
from pathlib import Path

from support.slurm import SlurmCluster, find_cluster

# Without a cluster this module is one skip, with the reason (an error in CI).
find_cluster()

TOKEN = "real-slurm-preemption-token"
SCRIPT = """#!/bin/bash
srun --ntasks=1 jaxcluster worker --address 127.0.0.1:0 --preemption-notice signal \\
    --preemption-signal USR1 --preemption-grace 100
echo "worker step exited with status $?"
"""


def test_slurm_signal_before_the_time_limit_is_a_preemption_notice(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "worker.sbatch"
    script.write_text(SCRIPT)
    # Slurm sends the signal to the step's tasks (no `B:`) once at most 100 s are left: about
    # 80 s in. Its man page allows up to 60 s early (slurmctld's check interval), so the
    # limit leaves the worker at least 20 s to start and install its handler first.
    job = slurm.sbatch(
        script,
        ["-N1", "--time=3", "--signal=USR1@100"],
        env={"JAXCLUSTER_AUTH_TOKEN": TOKEN},
        cwd=tmp_path,
    )
    done = slurm.wait_job(job, tmp_path, timeout=260)
    out = done.output
    assert (done.state, done.exit_code) == ("COMPLETED", "0:0"), out
    pattern = (
        r"a preemption notice reached worker 0 on \S+ \(signal: SIGUSR1\); deadline in ([\d.]+) s"
    )
    notice = re.search(pattern, out)
    assert notice and 90 <= float(notice.group(1)) <= 100, out
    assert "worker step exited with status 0" in out, out
    # It drained: it stopped well before the time limit, having said so.
    assert re.search(r"worker 0 stopped after \d+ closures", out), out
