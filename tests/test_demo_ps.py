"""``python -m jaxcluster demo --ps`` trains on 2 ps tasks and 2 workers, loses a ps task,
restarts from its checkpoint and lowers the loss."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("jax")


def test_the_ps_demo_recovers_from_a_killed_ps_and_the_loss_decreases() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "jaxcluster", "demo", "--ps", "--steps", "200"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = completed.stdout
    assert completed.returncode == 0, out + completed.stderr
    match = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", out)
    assert match is not None, out
    initial, final = float(match.group(1)), float(match.group(2))
    assert final < initial
    assert "join() raised PSUnavailableError: parameter server task 1" in out, out
    checkpoint = re.search(r"checkpoint at step (\d+) \(loss (\d+\.\d+)\)", out)
    restored = re.search(r"restored step (\d+) \(loss (\d+\.\d+)\)", out)
    assert checkpoint is not None and restored is not None, out
    # The restart resumed exactly where the checkpoint was taken.
    assert checkpoint.groups() == restored.groups()
    killed = re.search(r"killed at step (\d+)", out)
    assert killed is not None and int(killed.group(1)) > int(checkpoint.group(1)), out
    assert "200/200" in completed.stderr  # the progress bar reached the end
    assert "Fatal Python error" not in completed.stderr


def test_the_ps_demo_needs_two_steps() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "jaxcluster", "demo", "--ps", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert "--ps needs --steps 2 or more" in completed.stderr
