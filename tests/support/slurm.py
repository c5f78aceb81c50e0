"""The real Slurm test cluster of tests/real (started by tests/real/slurm/up.sh): finding
it, running srun/sbatch/mpirun against it with a clean environment, and reading what the
tasks printed.

Example::

    cluster = find_cluster()                  # skips (or fails in CI) when none is up
    records = cluster.probe(["-N2", "-n4"], "resolve")
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "real" / "probe.py"
RECIPE = REPO / "deploy" / "slurm" / "jaxcluster-ps.sbatch"
DEFAULT_CONF = Path("/tmp/jaxcluster-slurm/slurm.conf")
#: Set (as CI does) to make a missing cluster a failure instead of a skip.
REQUIRE_ENV = "JAXCLUSTER_REQUIRE_REAL_CLUSTERS"
NODES = {"n1": "127.0.0.2", "n2": "127.0.0.3", "n3": "127.0.0.4", "n4": "127.0.0.5"}
# Variables of an enclosing launcher or cluster that must not leak into the tests' jobs.
_FOREIGN = re.compile(
    r"^(SLURM_|SBATCH_|SRUN_|SALLOC_|OMPI_|PMIX_|JAXCLUSTER_|JAX_COORDINATOR|TF_CONFIG$|"
    r"CUDA_VISIBLE_DEVICES$)"
)


def _unavailable(reason: str) -> None:
    how = (
        "start one with `bash tests/real/slurm/up.sh` as root (it installs Debian's "
        "slurm-wlm, munge and openmpi-bin when missing), then `pytest tests/real`"
    )
    message = f"no real Slurm cluster: {reason}; {how}"
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{message} ({REQUIRE_ENV} is set, so this is an error)", pytrace=False)
    pytest.skip(message, allow_module_level=True)


@dataclass
class Job:
    """A finished batch job as ``scontrol show job`` reports it."""

    job_id: str
    state: str
    exit_code: str
    output: str


class SlurmCluster:
    """Commands against the test cluster, each with a clean environment plus ``env``."""

    def __init__(self, conf: Path) -> None:
        self.conf = conf
        env = {k: v for k, v in os.environ.items() if not _FOREIGN.match(k)}
        env.update(
            SLURM_CONF=str(conf),
            JAX_PLATFORMS="cpu",
            PYTHONUNBUFFERED="1",
            # The tests' interpreter (and its `jaxcluster` script) first on every node.
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            # mpirun refuses root without both; keep Open MPI's own traffic on loopback.
            OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
            OMPI_MCA_oob_tcp_if_include="lo",
            OMPI_MCA_btl_tcp_if_include="lo",
        )
        self.env = env
        self.python = sys.executable

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**self.env, **(extra or {})}

    def run(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 180.0,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Runs ``command``; on timeout cancels the jobs it named and fails the test."""
        try:
            return subprocess.run(
                list(command),
                env=self.environment(env),
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=cwd or REPO,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{' '.join(command)} did not finish within {timeout} s: {exc.stderr!r}")

    def unique_name(self) -> str:
        return f"jxr-{uuid.uuid4().hex[:8]}"

    def srun(
        self, options: Sequence[str], command: Sequence[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        name = self.unique_name()
        try:
            return self.run(
                ["srun", f"--job-name={name}", "--time=5", *options, *command], **kwargs
            )
        finally:
            self.scancel("--name", name)

    def probe(
        self,
        options: Sequence[str],
        mode: str,
        *args: str,
        env: Mapping[str, str] | None = None,
        launcher: Sequence[str] = ("srun",),
        **kwargs: Any,
    ) -> list[dict[str, Any]]:
        """Runs tests/real/probe.py MODE in every task of ``srun OPTIONS`` (or of another
        ``launcher`` such as mpirun); its records, by rank. Fails with the output when the
        launcher fails."""
        with tempfile.TemporaryDirectory(prefix="jaxcluster-probe-") as directory:
            command = [sys.executable, str(PROBE), mode, *args]
            full_env = {**(env or {}), "PROBE_DIR": directory}
            if list(launcher) == ["srun"]:
                result = self.srun(options, command, env=full_env, **kwargs)
            else:
                result = self.run([*launcher, *options, *command], env=full_env, **kwargs)
            shown = " ".join([*launcher, *options])
            assert result.returncode == 0, f"{shown} failed:\n{result.stdout}\n{result.stderr}"
            return records(Path(directory))

    def scancel(self, *args: str) -> None:
        subprocess.run(
            ["scancel", *args],
            env=self.env,
            capture_output=True,
            timeout=30,
            check=False,
        )

    def sbatch(
        self,
        script: Path,
        options: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path,
    ) -> str:
        """Submits ``script``; returns the job id. Output goes to ``cwd/job-<id>.out``."""
        result = self.run(
            ["sbatch", "--parsable", "--output=job-%j.out", "--time=10", *options, str(script)],
            env=env,
            cwd=cwd,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> tuple[str, str]:
        shown = self.run(["scontrol", "show", "job", "-o", job_id], timeout=30).stdout
        state = re.search(r"\bJobState=(\S+)", shown)
        code = re.search(r"\bExitCode=(\S+)", shown)
        return (state.group(1) if state else "UNKNOWN", code.group(1) if code else "?")

    def wait_job(self, job_id: str, cwd: Path, timeout: float = 240.0) -> Job:
        """Waits (polling, with a deadline) until the job has ended: a state in
        :data:`ENDED`. Every other state waits, the passing ones too (``SIGNALING`` while
        ``--signal`` is delivered, ``COMPLETING``, ``STAGE_OUT``; ``UNKNOWN`` when
        ``scontrol`` did not answer)."""
        deadline = time.monotonic() + timeout
        while True:
            state, code = self.job_state(job_id)
            if state in ENDED:
                return Job(job_id, state, code, read_output(cwd, job_id))
            if time.monotonic() > deadline:
                self.scancel(job_id)
                pytest.fail(
                    f"job {job_id} still {state} after {timeout} s; output so far:\n"
                    f"{read_output(cwd, job_id)}"
                )
            time.sleep(0.25)

    def wait_output(self, job_id: str, cwd: Path, pattern: str, timeout: float = 180.0) -> str:
        """The job's output once ``pattern`` (a regex) appears in it."""
        deadline = time.monotonic() + timeout
        while True:
            output = read_output(cwd, job_id)
            if re.search(pattern, output, re.MULTILINE):
                return output
            state, _ = self.job_state(job_id)
            if state in ENDED:
                pytest.fail(f"job {job_id} ended ({state}) before {pattern!r}:\n{output}")
            if time.monotonic() > deadline:
                self.scancel(job_id)
                pytest.fail(
                    f"{pattern!r} not in job {job_id}'s output after {timeout} s:\n{output}"
                )
            time.sleep(0.25)


#: The job states `scontrol show job` reports for a job that has ended (slurm's
#: `job_state_string` of the base states past RUNNING); any other state is on its way.
ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


def read_output(cwd: Path, job_id: str) -> str:
    path = cwd / f"job-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def records(directory: Path) -> list[dict[str, Any]]:
    """The probe records written to ``directory``, ordered by their ``rank``."""
    found = [json.loads(path.read_text()) for path in directory.glob("*.json")]
    return sorted(found, key=lambda r: int(r["rank"]))


def _alive(pid_file: Path) -> bool:
    text = pid_file.read_text().strip()
    if not text.isdigit():
        return False
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_cluster() -> SlurmCluster:
    """The running test cluster; skips (fails when ``JAXCLUSTER_REQUIRE_REAL_CLUSTERS`` is
    set) saying why when there is none."""
    missing = [tool for tool in ("srun", "sbatch", "scontrol", "mpirun") if not shutil.which(tool)]
    if missing:
        _unavailable(f"{', '.join(missing)} not installed")
    conf = Path(os.environ.get("SLURM_CONF") or DEFAULT_CONF)
    if not conf.exists():
        _unavailable(f"no cluster configuration at {conf}")
    pid_file = conf.parent / "slurmctld.pid"  # up.sh's layout: skip a stale state directory
    if pid_file.exists() and not _alive(pid_file):
        _unavailable(f"the slurmctld of {conf} is not running ({pid_file} is stale)")
    cluster = SlurmCluster(conf)
    try:
        shown = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30)
    except pytest.fail.Exception:
        shown = None
    states = dict(line.split() for line in shown.stdout.splitlines()) if shown else {}
    # A trailing '*' means not responding; "plnd" is a node the backfill scheduler has
    # planned for a job (or just did): up either way.
    up = ("idle", "mix", "alloc", "plnd", "comp", "resv")
    usable = {n for n, s in states.items() if s in up}
    if usable != set(NODES):
        detail = shown.stderr.strip() if shown else "sinfo timed out"
        _unavailable(f"sinfo with {conf} shows nodes {states or detail}; expected n1..n4 up")
    return cluster
