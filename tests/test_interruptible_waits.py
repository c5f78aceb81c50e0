"""Waits on the dispatcher end on Ctrl-C: a SIGINT delivered while the main thread is
blocked in ``remove_workers`` raises ``KeyboardInterrupt`` long before the wait would end."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from support.closures import local_cluster, wait_until

#: How long each closure holds its worker: the removal would wait this long.
HOLD_SECONDS = 60.0


def hold(directory: str) -> None:
    import os
    import pathlib
    import time

    pathlib.Path(directory, str(os.getpid())).touch()
    time.sleep(HOLD_SECONDS)


def test_remove_workers_is_interrupted_by_ctrl_c(tmp_path: Path) -> None:
    with local_cluster(2) as cluster, cluster.coordinator() as coordinator:
        # One closure per worker, each holding it: removing worker 1 waits for its closure.
        for _ in range(2):
            coordinator.schedule(hold, args=(str(tmp_path),))
        wait_until(lambda: len(list(tmp_path.iterdir())) == 2, "both workers run a closure")
        main = threading.main_thread().ident
        assert main is not None and threading.get_ident() == main
        timer = threading.Timer(0.5, signal.pthread_kill, args=(main, signal.SIGINT))
        began = time.monotonic()
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                coordinator.remove_workers([1])
        finally:
            timer.cancel()
        assert time.monotonic() - began < HOLD_SECONDS / 2
        # The removal goes on: worker 1 is no longer one of the coordinator's.
        assert 1 not in coordinator._membership.active().values()
