"""Sessions on a real `jaxcluster ps`: each strategy's variables are its own, a clean end
releases them at once, a SIGKILLed program's after --state-ttl, and reattach=True adopts a
killed predecessor's variables (with their Adam slots) keeping their values."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import jaxcluster
from jaxcluster._native import core
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.errors import FailedPreconditionError

TOKEN = "sessions-token"
LISTENING = re.compile(r"^jaxcluster ps listening on (\S+)$")


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCLUSTER_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["JAXCLUSTER_AUTH_TOKEN"] = TOKEN
    return env


@contextmanager
def ps_process(state_ttl: float) -> Iterator[str]:
    """A `jaxcluster ps` process with ``--state-ttl``; yields its address."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxcluster", "ps", "--state-ttl", str(state_ttl)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_environment(),
    )
    try:
        assert proc.stdout is not None
        match = LISTENING.match(proc.stdout.readline().strip())
        assert match, "the ps did not print its listening line"
        yield match.group(1)
    finally:
        proc.kill()
        proc.wait()


def _strategy(address: str, **kwargs: object) -> jaxcluster.ParameterServerStrategy:
    spec = jaxcluster.ClusterSpec({"worker": ["127.0.0.1:1"], "ps": [address]})
    return jaxcluster.ParameterServerStrategy(
        SimpleClusterResolver(spec), auth_token=TOKEN, **kwargs
    )


def _sessions(address: str) -> dict[str, core.SessionHeld]:
    status = core.PsClient(address, auth_token=TOKEN).get_status()
    return {s.id: s for s in status.sessions}


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


# A program on its own: a strategy on the ps at argv[1] that creates "w" from argv[2],
# prints its session, the value it reads and READY, then waits for a line on stdin.
_PROGRAM = """
import sys
import numpy as np
import jaxcluster
from jaxcluster.cluster_resolver import SimpleClusterResolver
spec = jaxcluster.ClusterSpec({"worker": ["127.0.0.1:1"], "ps": [sys.argv[1]]})
strategy = jaxcluster.ParameterServerStrategy(SimpleClusterResolver(spec))
with strategy.scope():
    w = strategy.Variable(np.full(4, float(sys.argv[2]), np.float32), name="w")
print("SESSION", strategy.session_id)
print("READ", w.read_value().tolist())
print("READY", flush=True)
sys.stdin.readline()
"""


class Program:
    """A Python program in a subprocess, read line by line."""

    def __init__(self, source: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", source, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_environment(),
        )
        self.lines: dict[str, str] = {}

    def until(self, key: str) -> str:
        """Reads lines until one starting with ``key``; returns the rest of it."""
        assert self.proc.stdout is not None
        while key not in self.lines:
            line = self.proc.stdout.readline()
            if not line:
                assert self.proc.stderr is not None
                raise AssertionError(f"the program ended before {key}: {self.proc.stderr.read()}")
            word, _, rest = line.strip().partition(" ")
            self.lines[word] = rest
        return self.lines[key]

    def finish(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=60) == 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_two_programs_naming_w_each_read_their_own_and_a_clean_exit_releases() -> None:
    with ps_process(state_ttl=3600) as address:
        strategy = _strategy(address)
        with strategy.scope():
            w = strategy.Variable(np.full(4, 1.0, np.float32), name="w")
        other = Program(_PROGRAM, address, "2")
        try:
            assert other.until("READ") == "[2.0, 2.0, 2.0, 2.0]"
            other.until("READY")
            theirs = other.until("SESSION")
            # Before sessions both read the second program's value.
            np.testing.assert_array_equal(w.read_value(), np.full(4, 1.0, np.float32))
            held = _sessions(address)
            assert (held[strategy.session_id].resources, held[theirs].resources) == (1, 1)
            assert held[theirs].bytes == 16 and held[theirs].connections >= 1
        finally:
            other.finish()  # a normal exit ends its session: released at once
        assert theirs not in _sessions(address)
        np.testing.assert_array_equal(w.read_value(), np.full(4, 1.0, np.float32))
        strategy.shutdown()
        assert strategy.session_id not in _sessions(address)
        strategy.shutdown()  # idempotent


def test_a_sigkilled_programs_variables_are_released_after_the_state_ttl() -> None:
    with ps_process(state_ttl=0.5) as address:
        program = Program(_PROGRAM, address, "3")
        try:
            program.until("READY")
            session = program.until("SESSION")
            assert _sessions(address)[session].bytes == 16
        finally:
            program.kill()
        _wait_for(lambda: session not in _sessions(address), "the vanished session is released")
        assert core.PsClient(address, auth_token=TOKEN).get_status().variables == 0


# A trainer: Adam on "w" from a re-attaching strategy; argv[2] steps, then it prints what it
# holds and waits to be killed.
_TRAINER = """
import sys
import numpy as np
import jaxcluster
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.strategy.optimizers import Adam
spec = jaxcluster.ClusterSpec({"worker": ["127.0.0.1:1"], "ps": [sys.argv[1]]})
strategy = jaxcluster.ParameterServerStrategy(SimpleClusterResolver(spec), reattach=True)
with strategy.scope():
    w = strategy.Variable(np.zeros(4, np.float32), name="w")
opt = Adam(learning_rate=0.1)
opt.build([w], strategy)
print("START", w.reattached, opt.iterations(w), w.read_value().tolist())
for step in range(int(sys.argv[2])):
    opt.apply_gradients([(np.arange(4, dtype=np.float32) + 1, w)])
print("END", opt.iterations(w), w.read_value().tolist())
print("READY", flush=True)
sys.stdin.readline()
"""


def test_reattach_keeps_values_and_adam_slots_across_a_sigkilled_trainer() -> None:
    with ps_process(state_ttl=600) as address:
        first = Program(_TRAINER, address, "5")
        try:
            assert first.until("START").startswith("False 0 ")
            end = first.until("END")
            first.until("READY")
        finally:
            first.kill()
        assert end.startswith("5 ")
        second = Program(_TRAINER, address, "3")
        try:
            # Re-attached: the value and step count of the killed run, and Adam's moments
            # (kept, not rebuilt: three more steps continue the same trajectory).
            assert second.until("START") == f"True {end}"
            after = second.until("END")
            second.until("READY")
        finally:
            second.kill()
        uninterrupted = Program(_TRAINER.replace("reattach=True", "reattach=False"), address, "8")
        try:
            assert uninterrupted.until("START").startswith("False 0 ")
            assert uninterrupted.until("END") == after
        finally:
            uninterrupted.kill()


def test_reattach_with_another_shape_is_an_error_naming_both() -> None:
    with ps_process(state_ttl=600) as address:
        first = _strategy(address)
        with first.scope():
            first.Variable(np.zeros(4, np.float32), name="w")
        second = _strategy(address, reattach=True)
        with second.scope(), pytest.raises(FailedPreconditionError) as caught:
            second.Variable(np.zeros((2, 3), np.float32), name="w")
        message = str(caught.value)
        assert "float32[4]" in message and "float32[2, 3]" in message, message
        assert second.variables == []
        # The live variable stayed with its session.
        assert first.variables[0].read_value().shape == (4,)
        # Without reattach a strategy's "w" is its own, as in TF.
        third = _strategy(address)
        with third.scope():
            w = third.Variable(np.ones(2, np.float32), name="w")
        assert not w.reattached
        first.shutdown()
        second.shutdown()
        third.shutdown()
