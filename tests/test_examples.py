"""Every program under examples/ runs at its small size (``--small``) on a LocalCluster and
prints what it claims: a loss that went down, trials counted, workers that came and went."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, timeout: float = 240, extra: tuple[str, ...] = ()) -> str:
    env = {**os.environ, "JAXCLUSTER_EXAMPLES_SMALL": "1"}
    env.pop("JAXCLUSTER_ENVIRONMENT", None)  # always the LocalCluster
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--small", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=EXAMPLES.parent,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def result_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, output
    return lines[0]


def loss_went_down(line: str, factor: float) -> tuple[float, float]:
    match = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", line)
    assert match, line
    before, after = float(match.group(1)), float(match.group(2))
    assert after < before * factor, line
    return before, after


def test_every_example_has_a_docstring_saying_how_to_run_it() -> None:
    programs = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))
    assert programs == [
        "device_state.py",
        "diloco.py",
        "elastic_slurm.py",
        "eval_sidecar.py",
        "multislice.py",
        "ps_tutorial.py",
        "sweep.py",
    ]
    for name in programs:
        text = (EXAMPLES / name).read_text()
        assert text.startswith('"""'), name
        doc = text.split('"""')[1]
        assert f"python examples/{name} --small" in doc and "Run it::" in doc, name


def test_ps_tutorial_trains_shards_and_restores_a_checkpoint() -> None:
    output = run_example("ps_tutorial.py")
    assert "kernel shards: 2 over 2 ps tasks" in output
    assert "RMSprop steps on the ps: 30" in output  # 3 epochs x 10 steps, counted on the ps
    assert "checkpoint restored: True" in output
    line = result_line(output)
    loss_went_down(line, 0.9)
    accuracy = float(line.rsplit(" ", 1)[1])
    assert accuracy > 0.7, line


def test_sweep_reports_failed_trials_and_finishes_the_others() -> None:
    output = run_example("sweep.py")
    match = re.search(r"RESULT trials (\d+) succeeded (\d+) failed (\d+)", result_line(output))
    assert match, output
    trials, succeeded, failed = map(int, match.groups())
    assert trials == 12 and succeeded + failed == trials
    assert failed >= 2 and succeeded >= 6, output
    assert output.count("failed: learning_rate=") == failed
    assert "diverged at step" in output
    assert re.search(r"best: learning_rate=0\.(1|5) ", output), output


def test_device_state_trains_on_every_device_of_each_worker() -> None:
    output = run_example("device_state.py")
    assert "devices per worker: [2, 2]" in output
    assert "devices used per step: [2]" in output
    loss_went_down(result_line(output), 0.5)


def test_multislice_steps_span_every_host_and_device_of_a_slice() -> None:
    output = run_example("multislice.py")
    assert "each step ran on 2 hosts and 4 devices" in output
    loss_went_down(result_line(output), 0.7)


def test_elastic_workers_join_and_leave_with_the_resolver() -> None:
    output = run_example("elastic_slurm.py")
    assert re.search(r"1 worker: workers up \[0\], 40 closures ran on \[0\]", output), output
    assert (
        result_line(output)
        == "RESULT grew to 3 workers, shrank to 2; closures on removed worker 0: 0"
    )
    after = re.search(r"2 workers: workers up \[([^]]*)\]", output)
    assert after and after.group(1) == "1, 2", output


@pytest.mark.timeout(300)
def test_eval_sidecar_evaluates_inline_and_from_checkpoints() -> None:
    output = run_example("eval_sidecar.py")
    inline = re.findall(r"inline: step (\d+) eval loss (\d+\.\d+)", output)
    assert [int(s) for s, _ in inline] == [20, 40, 60], output
    sidecar = re.findall(r"sidecar: step (\d+) eval loss (\d+\.\d+)", output)
    assert sidecar and int(sidecar[-1][0]) == 60, output  # the last checkpoint, always
    match = re.search(
        r"RESULT initial eval loss (\d+\.\d+), sidecar evaluated (\d+) checkpoints, "
        r"last (\d+\.\d+)",
        result_line(output),
    )
    assert match, output
    assert float(match.group(3)) < 0.5 * float(match.group(1)), output
    assert float(inline[-1][1]) == pytest.approx(float(sidecar[-1][1]), rel=1e-4)


@pytest.mark.timeout(420)
def test_diloco_matches_sync_dp_with_a_quarter_of_the_bytes_through_a_worker_kill(
    tmp_path: Path,
) -> None:
    summary_path = tmp_path / "summary.json"
    output = run_example(
        "diloco.py",
        timeout=400,
        extra=("--kill-worker-at-round", "2", "--json", str(summary_path)),
    )
    summary = json.loads(summary_path.read_text())
    runs = summary["runs"]
    assert summary["headline"] == "int8+ef"
    # The headline DiLoCo run (int8 with error feedback, a worker SIGKILLed mid-round)
    # ends within 2% of synchronous data parallelism on the same examples.
    assert abs(summary["loss_gap_vs_sync_dp"]) <= 0.02, output
    assert runs["int8+ef"]["loss"] == pytest.approx(runs["sync_dp"]["loss"], rel=0.02)
    assert runs["int8+ef"]["killed_and_resynced"] is True, output
    assert re.search(r"round 2: worker\(s\) \[\d\] SIGKILLed mid-round, restarted", output)
    assert re.search(r"worker \d re-synced from the ps at round \d+", output), output
    # Pseudo-gradients as int8 take at most a quarter of fp32's bytes on the wire.
    assert summary["int8_over_fp32_bytes_per_outer_step"] <= 0.25
    assert runs["fp32"]["pseudo_gradient_bytes_per_outer_step"] > 0
    # Talking every H steps: far fewer bytes per example than averaging every step.
    assert runs["int8+ef"]["bytes_per_example"] < runs["sync_dp"]["bytes_per_example"] / 4
    assert all(run["wall_s"] > 0 for run in runs.values())
    assert "RESULT DiLoCo (int8+ef) loss" in result_line(output)
