"""A worker frozen with SIGSTOP mid-run: how long until its closures finish elsewhere?

    python benches/freeze.py                      # heartbeat_timeout 5 s (the default)
    python benches/freeze.py --heartbeat-timeout none   # no heartbeats: HTTP/2 keepalive only

Two workers run ``--closures`` closures of ``--sleep`` seconds each. Once worker 1 has
started one, it is frozen (SIGSTOP) until the end of the run. Reported: the time from the
freeze until every closure has returned, what worker 0 alone would need for what was left
(the floor), and the difference (time lost to the frozen worker); then, after SIGCONT, how
many closures ran twice (at most the one worker 1 was running may).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from jaxcluster import LocalCluster


def nap(directory: str, i: int, seconds: float) -> int:
    """Runs on a worker: records its start, sleeps, returns ``i``."""
    Path(directory, f"{i}.{os.getpid()}.{uuid.uuid4().hex}").touch()
    threading.Event().wait(seconds)
    return i


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--closures", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--heartbeat-timeout", default="5")
    args = parser.parse_args()
    timeout = None if args.heartbeat_timeout.lower() == "none" else float(args.heartbeat_timeout)
    with tempfile.TemporaryDirectory() as directory, LocalCluster(2) as cluster:
        with cluster.coordinator(heartbeat_timeout=timeout) as coordinator:
            coordinator.fetch([coordinator.schedule(nap, args=(directory, -1, 0.0))] * 4)
            frozen = cluster.worker_pid(1)
            assert frozen is not None
            rvs = [
                coordinator.schedule(nap, args=(directory, i, args.sleep))
                for i in range(args.closures)
            ]
            while not list(Path(directory).glob(f"*.{frozen}.*")):
                threading.Event().wait(0.005)
            os.kill(frozen, signal.SIGSTOP)
            start = time.monotonic()
            left = args.closures - len(list(Path(directory).glob("[0-9]*")))
            try:
                assert coordinator.fetch(rvs) == list(range(args.closures))
                elapsed = time.monotonic() - start
            finally:
                os.kill(frozen, signal.SIGCONT)
            coordinator.fetch([coordinator.schedule(nap, args=(directory, -2, 0.0))] * 4)
        starts = Counter(p.name.split(".")[0] for p in Path(directory).iterdir())
        twice = sorted(int(i) for i, n in starts.items() if n > 1 and int(i) >= 0)
    floor = left * args.sleep
    print(f"heartbeat_timeout={timeout}: all closures done {elapsed:.2f} s after the freeze")
    print(
        f"worker 0 alone needed >= {floor:.2f} s for the {left} left: {elapsed - floor:.2f} s lost"
    )
    print(f"closures started twice: {twice} (at most the one the frozen worker was running)")
    return 0 if len(twice) <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
