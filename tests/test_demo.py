"""``python -m jaxcluster demo`` trains, survives a killed worker, and lowers the loss."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("jax")


def test_the_demo_runs_and_the_loss_decreases() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "jaxcluster", "demo", "--steps", "300"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    match = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", completed.stdout)
    assert match is not None, completed.stdout
    initial, final = float(match.group(1)), float(match.group(2))
    assert final < 0.5 * initial
    counts = re.search(
        r"closures run (\d+), retries seen (\d+), worker failures (\d+)", completed.stdout
    )
    assert counts is not None, completed.stdout
    assert int(counts.group(1)) >= 300
    assert int(counts.group(3)) >= 1  # a worker was killed midway
    assert re.search(r"\d+ closures/s", completed.stdout)
    assert "300/300" in completed.stderr  # the progress bar reached the end


def test_bad_demo_flags_are_rejected() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "jaxcluster", "demo", "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert "0 is not at least 1" in completed.stderr


def test_the_slices_demo_survives_a_killed_host() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "jaxcluster", "demo", "--slices", "--steps", "200"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr[-3000:]
    match = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", completed.stdout)
    assert match is not None, completed.stdout
    assert float(match.group(2)) < float(match.group(1))
    per_slice = re.search(r"steps per slice \[(\d+), (\d+)\]", completed.stdout)
    assert per_slice is not None, completed.stdout
    assert int(per_slice.group(1)) + int(per_slice.group(2)) == 200
    assert int(per_slice.group(2)) > 0  # the other slice took steps
    recovered = re.search(
        r"slice failures (\d+); slice 0 re-formed and served again (\d+\.\d) s", completed.stdout
    )
    assert recovered is not None, completed.stdout
    assert int(recovered.group(1)) >= 1


def test_ps_and_slices_together_are_refused() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "jaxcluster", "demo", "--ps", "--slices"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert "choose one of --ps and --slices" in completed.stderr
