"""A runtime of one thread lends its work to the thread that waits (``rust/runtime/lend.rs``).

Each case runs a coordinator and its local workers in a process of its own, since the
runtime's flavour is chosen once per process from ``JAXCLUSTER_RUNTIME_THREADS``,
``JAXCLUSTER_SPIN_US`` and ``JAXCLUSTER_RUNTIME_LEND`` (the workers inherit them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

_SCRIPT = r"""
import json, time
import numpy as np
from jaxcluster import LocalCluster, _core

def add_one(x):
    return x + 1

def lending():
    import os
    from jaxcluster import _core
    return os.getpid(), _core.runtime_lending().to_dict()

def slow(x):
    time.sleep(0.002)
    return x * 2

with LocalCluster(2) as cluster, cluster.coordinator() as co:
    # Serial round trips: the thread in fetch() waits for each.
    serial = [co.schedule(add_one, args=(i,)).fetch() for i in range(300)]
    # Polled, never fetched until done: nobody spins for these.
    polled = []
    for i in range(50):
        value = co.schedule(add_one, args=(i,))
        deadline = time.monotonic() + 30
        while not value.done():
            assert time.monotonic() < deadline, "a polled closure never finished"
        polled.append(value.fetch())
    # Scheduled, then joined; closures longer than a spin; an array both ways.
    many = [co.schedule(slow, args=(i,)) for i in range(40)]
    co.join()
    arrays = co.schedule(add_one, args=(np.arange(1 << 16, dtype=np.float32),)).fetch()
    # Each worker's own lending, as its closures see it (by pid: whichever ran them).
    workers = dict(co.fetch([co.schedule(lending) for _ in range(20)]))
    print(json.dumps({
        "serial": serial,
        "polled": polled,
        "many": [v.fetch() for v in many],
        "array_ok": bool((arrays == np.arange(1 << 16, dtype=np.float32) + 1).all()),
        "coordinator": _core.runtime_lending().to_dict(),
        "workers": list(workers.values()),
    }))
"""


def _run(env: dict[str, str]) -> dict[str, Any]:
    full = {**os.environ, **env}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        env=full,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["serial"] == [i + 1 for i in range(300)]
    assert result["polled"] == [i + 1 for i in range(50)]
    assert result["many"] == [i * 2 for i in range(40)]
    assert result["array_ok"]
    return result


def test_with_one_runtime_thread_and_spinning_the_waiters_drive_the_runtime() -> None:
    result = _run({"JAXCLUSTER_RUNTIME_THREADS": "1", "JAXCLUSTER_SPIN_US": "500"})
    assert result["coordinator"]["lending"] is True
    # Every fetch() right after schedule() spun for its answer, on the runtime it borrowed
    # (unless its trials kept it parked throughout, which a serial loop does not do).
    assert result["coordinator"]["lends"] > 0
    assert result["workers"]
    for worker in result["workers"]:
        # The executor spun for its next closure, on the runtime it borrowed.
        assert worker["lending"] is True
        assert worker["lends"] > 0


@pytest.mark.parametrize(
    "env",
    [
        {"JAXCLUSTER_RUNTIME_THREADS": "1", "JAXCLUSTER_RUNTIME_LEND": "0"},
        {"JAXCLUSTER_RUNTIME_THREADS": "1", "JAXCLUSTER_SPIN_US": "0"},
        {"JAXCLUSTER_RUNTIME_THREADS": "2", "JAXCLUSTER_SPIN_US": "500"},
    ],
    ids=["turned-off", "spinning-off", "two-runtime-threads"],
)
def test_otherwise_the_runtime_keeps_its_own_thread(env: dict[str, str]) -> None:
    result = _run(env)
    assert result["coordinator"] == {"lending": False, "lends": 0}
    assert result["workers"]
    assert all(worker == {"lending": False, "lends": 0} for worker in result["workers"])
