"""Log records through the ``jaxcluster`` logger hierarchy, Rust events included: what a
user sees when a worker cannot be reached, is lost, comes back or is given up; that
nothing prints unless the application configures logging; that levels are honoured in
Rust; and the worker and ps processes' own stderr log lines."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jaxcluster import ClusterSpec
from jaxcluster._native import core
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.errors import DeadlineExceededError, UnavailableError
from support.closures import gated_square, local_cluster, wait_until
from support.workers import running_worker

TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) ")


class Records(logging.Handler):
    """Collects the records of the ``jaxcluster`` loggers from any thread."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock_records = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_records:
            self.records.append(record)

    def matching(self, level: int, name: str, *parts: str) -> list[logging.LogRecord]:
        with self._lock_records:
            return [
                r
                for r in self.records
                if r.levelno == level
                and r.name == name
                and all(part in r.getMessage() for part in parts)
            ]

    def wait_for(self, level: int, name: str, *parts: str) -> logging.LogRecord:
        found = wait_until(
            lambda: self.matching(level, name, *parts),
            f"a {logging.getLevelName(level)} record of {name} with {parts}",
        )
        return found[0]


@pytest.fixture
def records() -> Iterator[Callable[[int], Records]]:
    """``records(level)``: the ``jaxcluster`` logger at ``level``, its records collected."""
    logger = logging.getLogger("jaxcluster")
    old_level = logger.level
    handler = Records()

    def at(level: int) -> Records:
        logger.setLevel(level)
        core.refresh_log_levels()
        return handler

    logger.addHandler(handler)
    try:
        yield at
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        core.refresh_log_levels()


def _free_address() -> str:
    """A loopback port nobody listens on (bound and closed again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _coordinator(address: str, **kwargs: object) -> ClusterCoordinator:
    resolver = SimpleClusterResolver(ClusterSpec({"worker": [address]}))
    return ClusterCoordinator(resolver, auth_token="t", **kwargs)  # type: ignore[arg-type]


def test_an_unreachable_worker_is_one_warning_and_fetch_says_why(
    records: Callable[[int], Records],
) -> None:
    log = records(logging.INFO)
    address = _free_address()
    with _coordinator(address) as coordinator:
        value = coordinator.schedule(lambda: 1)
        warning = log.wait_for(logging.WARNING, "jaxcluster.dispatch", "cannot reach", address)
        message = warning.getMessage()
        assert "Connection refused" in message and "recovery_timeout=" in message
        # Structured fields travel as record attributes.
        assert warning.worker == address  # type: ignore[attr-defined]
        assert warning.pathname.endswith(".rs") and warning.lineno > 0
        with pytest.raises(DeadlineExceededError) as raised:
            value.fetch(timeout=0.2)
        text = str(raised.value)
        assert f"worker {address} recovering" in text and "Connection refused" in text
        assert "no worker is serving" in text
        wait_until(
            lambda: coordinator.workers[0]["in_state_seconds"] > 0.5, "a few failed attempts"
        )
    # Later failed attempts say nothing new at WARNING.
    assert len(log.matching(logging.WARNING, "jaxcluster.dispatch", "cannot reach")) == 1


def test_recovery_timeout_gives_up_with_an_error_record(
    records: Callable[[int], Records],
) -> None:
    log = records(logging.WARNING)
    address = _free_address()
    with _coordinator(address, recovery_timeout=0.5) as coordinator:
        value = coordinator.schedule(lambda: 1)
        with pytest.raises(UnavailableError, match="recovery_timeout=") as raised:
            value.fetch(timeout=60)
        assert address in str(raised.value) and "Connection refused" in str(raised.value)
    log.wait_for(logging.ERROR, "jaxcluster.dispatch", "gave up on worker", address)
    log.wait_for(logging.ERROR, "jaxcluster.dispatch", "every worker (1) was given up")


@pytest.mark.parametrize("bad", [0, -1, "soon", True])
def test_a_bad_recovery_timeout_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"recovery_timeout={bad!r}"):
        _coordinator("127.0.0.1:1", recovery_timeout=bad)


def test_levels_are_honoured_in_rust_and_changes_apply(
    records: Callable[[int], Records],
) -> None:
    log = records(logging.WARNING)
    address = _free_address()
    with _coordinator(address) as coordinator:
        log.wait_for(logging.WARNING, "jaxcluster.dispatch", "cannot reach")
        # Attempts 2, 3, ... are DEBUG: filtered while the level is WARNING...
        wait_until(
            lambda: coordinator.workers[0]["in_state_seconds"] > 0.5, "a few failed attempts"
        )
        assert not log.matching(logging.DEBUG, "jaxcluster.dispatch")
        # ...and delivered once it is DEBUG.
        records(logging.DEBUG)
        log.wait_for(logging.DEBUG, "jaxcluster.dispatch", "still unreachable", address)


def test_a_lost_worker_is_a_warning_its_closures_go_back_and_its_return_is_info(
    records: Callable[[int], Records], tmp_path: Path
) -> None:
    log = records(logging.DEBUG)
    gate = tmp_path / "gate"
    with local_cluster(2) as cluster, cluster.coordinator() as coordinator:
        values = [
            coordinator.schedule(gated_square, args=(str(tmp_path), i, str(gate))) for i in range(2)
        ]
        wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 2, "both closures started")
        victim = cluster.addresses[1]
        cluster.kill_worker(1)
        lost = log.wait_for(logging.WARNING, "jaxcluster.dispatch", "lost worker", victim)
        assert "1 closure(s)" in lost.getMessage()
        log.wait_for(logging.DEBUG, "jaxcluster.dispatch", "goes back to the queue", victim)
        gate.touch()
        assert [v.fetch(timeout=120) for v in values] == [0, 1]
        cluster.restart_worker(1)
        back = log.wait_for(logging.INFO, "jaxcluster.dispatch", "is back", victim)
        assert "a new worker process" in back.getMessage()
        assert coordinator.metrics()["retried"] >= 1


def test_nothing_is_printed_unless_logging_is_configured() -> None:
    script = (
        "import logging, time\n"
        "import jaxcluster\n"
        "from jaxcluster._native import core\n"
        "assert any(isinstance(h, logging.NullHandler) "
        "for h in logging.getLogger('jaxcluster').handlers)\n"
        "assert not logging.getLogger().handlers, 'the library configured the root logger'\n"
        "d = core.Dispatcher(['127.0.0.1:1'], recovery_timeout=0.3)\n"
        # Waits for the first failure (a WARNING) and giving up (an ERROR) to happen.
        "deadline = time.monotonic() + 60\n"
        "while d.worker_statuses()[0]['state'] != 'given_up' and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print(d.worker_statuses()[0]['state'])\n"
        "d.shutdown()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "given_up"
    assert done.stderr == ""


def test_a_coordinator_collected_without_shutdown_stops_its_links_while_they_log() -> None:
    # The links log (DEBUG) each closure they cancel as they stop, which takes the GIL;
    # the dispatcher's drop awaits them on the thread that collects it. With the GIL held
    # through that wait, this hung for good.
    script = f"""
import gc, logging, sys, threading, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s")
from support.workers import running_worker, wait_until
from jaxcluster import ClusterSpec
from jaxcluster._native import core
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator

def nap():
    threading.Event().wait(0.5)
    return 1

with running_worker([], token="tok") as worker:
    resolver = SimpleClusterResolver(ClusterSpec({{"worker": [worker.address]}}))
    coordinator = ClusterCoordinator(resolver, auth_token="tok")
    values = [coordinator.schedule(nap) for _ in range(8)]
    client = worker.client(token="tok")
    wait_until(lambda: client.get_status().queued > 0, what="closures queued on the worker")
    core.refresh_log_levels()
    del coordinator, values
    gc.collect()
    print("collected", flush=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "collected"
    assert "the coordinator shut down while it was on worker" in done.stderr, done.stderr[-3000:]


def test_a_worker_process_logs_with_timestamps_and_says_it_drains() -> None:
    with running_worker([], token="right") as worker:
        with pytest.raises(Exception, match="token"):
            worker.client(token="wrong").get_status(timeout=10.0)
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.finish() == 0
    lines = worker.err_lines
    refused = [
        line for line in lines if "jaxcluster.auth: refused a request from 127.0.0.1" in line
    ]
    assert refused and all(TIMESTAMPED.match(line) for line in refused), lines
    draining = [line for line in lines if "INFO jaxcluster.worker: worker 0 on" in line]
    assert draining and "draining" in draining[0] and TIMESTAMPED.match(draining[0]), lines
    assert any("INFO jaxcluster.worker: worker 0 stopped after" in line for line in lines), lines


def test_a_refused_setting_is_one_warning_of_its_own_logger_and_the_worker_serves() -> None:
    # Read inside a OnceLock by whichever thread needs the runtime first; logged after the
    # lock is released (a warning takes the GIL), once, under jaxcluster.settings.
    env = {
        "JAXCLUSTER_RUNTIME_THREADS": "nine",
        "JAXCLUSTER_SPIN_US": "-5",
        "JAXCLUSTER_RUNTIME_LEND": "maybe",
    }
    with running_worker([], env=env) as worker:
        assert worker.client().get_status(timeout=10.0) is not None
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.finish() == 0
    lines = worker.err_lines
    threads = [line for line in lines if "JAXCLUSTER_RUNTIME_THREADS" in line]
    assert len(threads) == 1, lines
    assert "WARNING jaxcluster.settings:" in threads[0] and TIMESTAMPED.match(threads[0])
    assert "'nine'" in threads[0] or '"nine"' in threads[0]
    assert "a whole number from 1 to 4" in threads[0]
    spin = [line for line in lines if "JAXCLUSTER_SPIN_US" in line]
    assert len(spin) == 1 and "a whole number of microseconds" in spin[0], lines
    lend = [line for line in lines if "JAXCLUSTER_RUNTIME_LEND" in line]
    assert len(lend) == 1 and "0 or 1" in lend[0] and '"maybe"' in lend[0], lines


def test_a_worker_process_log_level_is_a_flag() -> None:
    with running_worker(["--log-level", "warning"]) as worker:
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.finish() == 0
    assert not [line for line in worker.err_lines if " INFO " in line], worker.err_lines


def test_a_ps_process_logs_why_it_stops() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCLUSTER_")}
    env.update({"JAXCLUSTER_AUTH_TOKEN": "tok", "PYTHONUNBUFFERED": "1"})
    # A port of its own: the default one may be taken by another test's or run's ps.
    ps = subprocess.Popen(
        [sys.executable, "-m", "jaxcluster", "ps", "--address", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert ps.stdout is not None
    assert ps.stdout.readline().startswith("jaxcluster ps listening on ")
    ps.send_signal(signal.SIGTERM)
    _, err = ps.communicate(timeout=60)
    assert ps.returncode == 0, err
    [line] = [line for line in err.splitlines() if "jaxcluster.ps:" in line]
    assert TIMESTAMPED.match(line) and "ps 0 stopping (SIGTERM)" in line, err
