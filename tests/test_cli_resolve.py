"""`jaxcluster resolve` as a user runs it: `python -m jaxcluster resolve ...` in a subprocess
with a TF_CONFIG or Slurm environment."""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import subprocess
import sys

import pytest

from jaxcluster.cli import COMMANDS, main
from support.cluster_env import bare_env, clear_cluster_env

TF_CONFIG = {
    "cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"]},
    "task": {"type": "worker", "index": 0},
}
SLURM = {
    "SLURM_JOB_ID": "42",
    "SLURM_PROCID": "3",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "gpu[09-10]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "CUDA_VISIBLE_DEVICES": "",
}


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = bare_env()
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "jaxcluster", "resolve", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_json_from_tf_config() -> None:
    result = _run("--format", "json", env={"TF_CONFIG": json.dumps(TF_CONFIG)})

    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["environment"] == "tf_config"
    assert out["resolver"] == "TFConfigClusterResolver"
    assert out["cluster_spec"] == TF_CONFIG["cluster"]
    assert (out["task_type"], out["task_id"], out["rpc_layer"]) == ("worker", 0, None)
    assert out["master"] == "w0:2222"
    assert out["jax_distributed_args"] == {
        "coordinator_address": "c0:2222",
        "num_processes": 3,
        "process_id": 1,
    }
    assert out["sources"]["task_id"] == "TF_CONFIG task.index"


def test_overrides_from_flags() -> None:
    result = _run(
        "--task-type",
        "chief",
        "--task-id",
        "0",
        "--rpc-layer",
        "grpc",
        env={"TF_CONFIG": json.dumps(TF_CONFIG)},
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert (out["task_type"], out["task_id"], out["rpc_layer"]) == ("chief", 0, "grpc")
    assert out["master"] == "grpc://c0:2222"
    assert out["jax_distributed_args"]["process_id"] == 0
    assert out["sources"]["task_type"] == "override task_type='chief'"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to eval the output")
def test_env_output_evals_in_a_shell_for_slurm() -> None:
    result = _run("--format", "env", env=SLURM)
    assert result.returncode == 0, result.stderr
    exported = sorted(
        line.split("=", 1)[0].removeprefix("export ")
        for line in result.stdout.splitlines()
        if line.startswith("export ")
    )
    # Only what something reads: TF, jaxcluster and JAX read these; JAX reads no
    # JAX_NUM_PROCESSES / JAX_PROCESS_ID, so they are not exported.
    assert exported == ["JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT", "TF_CONFIG"]
    assert "num_processes=4, process_id=3" in result.stdout

    # Let a real shell evaluate the lines, then read back what it exported.
    script = f'{result.stdout}\nprintf "%s\\n" "$TF_CONFIG" "$JAX_COORDINATOR_ADDRESS"'
    shell = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True, timeout=30
    )
    tf_config, coordinator = shell.stdout.splitlines()
    assert json.loads(tf_config) == {
        "cluster": {"worker": ["gpu09:8888", "gpu09:8889", "gpu10:8888", "gpu10:8889"]},
        "task": {"type": "worker", "index": 3},
        "rpc_layer": "grpc",
    }
    # The coordinator port is the one jax.distributed derives from SLURM_JOB_ID=42.
    assert coordinator == f"gpu09:{42 % 4096 + 61440}"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to eval the output")
def test_exported_variables_are_enough_for_jaxcluster_initialize() -> None:
    """eval the output, drop the environment it came from, and initialise a real one-process
    jax.distributed from what was exported."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    source = {"JAXCLUSTER_WORKERS": f"127.0.0.1:{port}", "JAXCLUSTER_TASK_ID": "0"}
    result = _run("--format", "env", env=source)
    assert result.returncode == 0, result.stderr
    child = (
        "import jax, jaxcluster, os; "
        "assert 'JAXCLUSTER_WORKERS' not in os.environ; "
        "args = jaxcluster.initialize(); "
        "print(args['coordinator_address'], os.environ['JAX_COORDINATOR_ADDRESS'], "
        "jax.process_count(), jax.process_index()); "
        "jax.distributed.shutdown()"
    )
    script = f"{result.stdout}\nunset JAXCLUSTER_WORKERS JAXCLUSTER_TASK_ID\n"
    script += f"exec {shlex.quote(sys.executable)} -c {shlex.quote(child)}"
    shell = subprocess.run(
        ["bash", "-c", script], env=bare_env(), capture_output=True, text=True, timeout=120
    )
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.split() == [f"127.0.0.1:{port}", f"127.0.0.1:{port}", "1", "0"]


def test_explain_output_shows_provenance() -> None:
    result = _run("--format", "explain", env=SLURM)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "* slurm" in text and "- tf_config   TF_CONFIG is not set" in text
    assert "task_id=3 from SLURM_PROCID=3" in text
    assert "Chosen: slurm (first environment detected), resolver SlurmClusterResolver" in text
    assert "rpc_layer='grpc' from the SlurmClusterResolver default" in text
    assert "coordinator port from SLURM_JOB_ID=42" in text


def test_environment_flag_picks_a_later_environment() -> None:
    env = {"TF_CONFIG": json.dumps(TF_CONFIG), **SLURM}
    assert json.loads(_run(env=env).stdout)["environment"] == "tf_config"
    out = json.loads(_run("--environment", "slurm", env=env).stdout)
    assert out["environment"] == "slurm" and out["task_id"] == 3


@pytest.mark.parametrize(
    ("env", "environment", "resolver"),
    [
        ({"TF_CONFIG": json.dumps(TF_CONFIG)}, "tf_config", "TFConfigClusterResolver"),
        (SLURM, "slurm", "SlurmClusterResolver"),
        (
            {"JAXCLUSTER_WORKERS": "w0:2222,w1:2222", "JAXCLUSTER_TASK_ID": "1"},
            "explicit",
            "SimpleClusterResolver",
        ),
        (  # Open MPI with a worker list: a SimpleClusterResolver as is
            {
                "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_RANK": "1",
                "JAXCLUSTER_WORKERS": "w0:2222,w1:2222",
            },
            "ompi",
            "SimpleClusterResolver",
        ),
        (  # Open MPI knowing only rank 0: a private subclass, named as the public one
            {
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_RANK": "2",
                "JAX_COORDINATOR_ADDRESS": "head:1234",
            },
            "ompi",
            "SimpleClusterResolver",
        ),
    ],
)
def test_json_names_a_public_resolver_class(
    env: dict[str, str], environment: str, resolver: str
) -> None:
    import jaxcluster.cluster_resolver as public

    result = _run("--format", "json", env=env)

    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert (out["environment"], out["resolver"]) == (environment, resolver)
    assert hasattr(public, out["resolver"])


def test_malformed_tf_config_exits_1_with_one_paragraph() -> None:
    result = _run("--format", "env", env={"TF_CONFIG": '{"cluster": ["oops"'})

    assert result.returncode == 1
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1  # one paragraph, one line
    assert result.stderr.startswith("jaxcluster resolve: error: the tf_config environment")
    assert "TF_CONFIG is not valid JSON" in result.stderr


def test_bare_environment_exits_1_listing_what_was_tried() -> None:
    result = _run()

    assert result.returncode == 1
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert "no cluster environment detected" in result.stderr
    for name in ("tf_config", "slurm", "kubernetes", "gke_tpu", "sagemaker", "ompi", "explicit"):
        assert f"{name}: " in result.stderr
    assert "--environment" in result.stderr


def test_explain_of_a_bare_environment_exits_1() -> None:
    result = _run("--format", "explain")
    assert result.returncode == 1
    assert "Error: no cluster environment detected" in result.stdout


def test_help_lists_only_installed_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for name, (module, _) in COMMANDS.items():
        installed = importlib.util.find_spec(module) is not None
        assert (f"    {name} " in text) == installed, name
    assert "    resolve " in text


def test_main_in_process_returns_status(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_cluster_env(monkeypatch)
    monkeypatch.setenv("JAXCLUSTER_WORKERS", "10.0.0.1:2222,10.0.0.2:2222")
    monkeypatch.setenv("JAXCLUSTER_TASK_ID", "1")
    assert main(["resolve", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["environment"] == "explicit" and out["master"] == "grpc://10.0.0.2:2222"

    with pytest.raises(SystemExit) as info:
        main(["resolve", "--environment", "slurmm"])
    assert info.value.code == 2
    assert "invalid choice: 'slurmm'" in capsys.readouterr().err
