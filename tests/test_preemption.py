"""Preemption notices (`jaxcluster worker --preemption-notice`): real worker processes, a
real coordinator, and local fake metadata servers (real HTTP servers on 127.0.0.1 speaking
the GCE metadata server's and EC2 IMDSv2's text and JSON) that flip the notice while
closures run. SIGTERM and `--preemption-signal USR1` too."""

from __future__ import annotations

import calendar
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from jaxcluster import ClusterSpec
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.worker.preemption import AwsSpotWatch, signal_number
from support.closures import TESTS_DIR, wait_until
from support.workers import WorkerProc, running_worker


def record_run(i: int, directory: str, seconds: float) -> int:
    """Runs on a worker: sleeps, then leaves ``<i>-<pid>-<start>`` in ``directory``."""
    start = time.time()
    time.sleep(seconds)
    Path(directory, f"{i}-{os.getpid()}-{start:.6f}").touch()
    return i


def _runs(directory: Path) -> list[tuple[int, int, float]]:
    """(closure, worker pid, start time) of every run recorded."""
    runs = []
    for path in directory.iterdir():
        i, pid, start = path.name.split("-")
        runs.append((int(i), int(pid), float(start)))
    return runs


class _Notice:
    """A value a fake metadata server serves, flipped by the test; waiters wake on a flip."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.etag = 1
        self.changed = threading.Condition()
        self.requests = 0

    def flip(self, value: str) -> None:
        with self.changed:
            self.value = value
            self.etag += 1
            self.changed.notify_all()


class _FakeGce(BaseHTTPRequestHandler):
    """The GCE metadata server: `Metadata-Flavor: Google` both ways, `wait_for_change` with
    `last_etag` and `timeout_sec`, text values, an `ETag` header."""

    keys: dict[str, _Notice]

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            self.send_error(403)
            return
        url = urlparse(self.path)
        query = parse_qs(url.query)
        notice = self.keys.get(url.path.removeprefix("/computeMetadata/v1/"))
        if url.path == "/":
            body = "computeMetadata/\n"
        elif notice is None:
            self.send_error(404)
            return
        else:
            notice.requests += 1
            with notice.changed:
                if query.get("wait_for_change") == ["true"]:
                    last = query.get("last_etag", [""])[0]
                    timeout = float(query.get("timeout_sec", ["60"])[0])
                    notice.changed.wait_for(lambda: str(notice.etag) != last, timeout)
                body, etag = notice.value, notice.etag
            self.send_response(200)
            self.send_header("ETag", str(etag))
        if url.path == "/":
            self.send_response(200)
        encoded = body.encode()
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(encoded)))
        self.end_headers()
        self.wfile.write(encoded)


class _FakeImds(BaseHTTPRequestHandler):
    """EC2 IMDSv2: a token from `PUT /latest/api/token`, then `spot/instance-action` 404
    until a notice, then its JSON; 401 without the token."""

    action: _Notice
    token = "fake-imds-token"

    def log_message(self, *args: Any) -> None:
        pass

    def do_PUT(self) -> None:
        if self.path != "/latest/api/token" or not self.headers.get(
            "X-aws-ec2-metadata-token-ttl-seconds"
        ):
            self.send_error(400)
            return
        self._answer(200, self.token)

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != self.token:
            self.send_error(401)
            return
        if self.path != "/latest/meta-data/spot/instance-action":
            self.send_error(404)
            return
        self.action.requests += 1
        if not self.action.value:
            self.send_error(404)
            return
        self._answer(200, self.action.value)

    def _answer(self, code: int, body: str) -> None:
        encoded = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(encoded)))
        self.end_headers()
        self.wfile.write(encoded)


@contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _dispatch_warnings() -> Iterator[list[logging.LogRecord]]:
    from jaxcluster._native import core

    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("jaxcluster.dispatch")
    handler = Collect(logging.WARNING)
    logger.addHandler(handler)
    core.refresh_log_levels()
    try:
        yield records
    finally:
        logger.removeHandler(handler)


@contextmanager
def _busy(worker: WorkerProc, tmp_path: Path) -> Iterator[Any]:
    """Keeps a closure running on ``worker`` (so it does not drain and exit at once) until
    the block ends; yields a client of it."""
    from jaxcluster import wire
    from jaxcluster.coordinator import functions

    release = tmp_path / "release"

    def wait_for_release(path: str) -> str:
        deadline = time.monotonic() + 90
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return "released"

    client = worker.client()
    payload = functions.pickle_function(wait_for_release)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    args = wire.encode(((str(release),), {}))
    caller = threading.Thread(
        target=lambda: client.run_closure(payload.function_hash, args.pickle), daemon=True
    )
    caller.start()
    wait_until(lambda: client.get_status()["inflight"] == 1, "the closure running")
    try:
        yield client
    finally:
        release.touch()
        caller.join(timeout=60)


def _worker_env(**extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(TESTS_DIR), **extra}


def _notice_moves_work_elsewhere(
    preempted: WorkerProc, other: WorkerProc, flip: Any, source: str, tmp_path: Path
) -> float:
    """Runs closures on both workers, calls ``flip()`` once the preempted one has run some,
    and checks what a notice promises. Returns the notice's deadline as the coordinator saw
    it."""
    resolver = SimpleClusterResolver(ClusterSpec({"worker": [preempted.address, other.address]}))
    runs = tmp_path / "runs"
    runs.mkdir()
    preempted_pid = preempted.client().get_status()["pid"]
    with (
        _dispatch_warnings() as warnings,
        ClusterCoordinator(
            resolver, auth_token=preempted.token, max_closure_retries=0
        ) as coordinator,
    ):
        values = [coordinator.schedule(record_run, args=(i, str(runs), 0.05)) for i in range(120)]
        wait_until(
            lambda: any(pid == preempted_pid for _, pid, _ in _runs(runs)),
            "a closure run on the worker to be preempted",
        )
        flipped = time.time()
        flip()
        wait_until(
            lambda: coordinator.workers[0].state == "preempting", "the worker seen preempting"
        )
        status = coordinator.workers[0]
        assert status.preemption_source == source
        deadline = status.preemption_deadline
        assert deadline is not None and deadline > flipped
        assert coordinator.join(timeout=120)
        assert sorted(v.fetch() for v in values) == list(range(120))
        metrics = coordinator.metrics()
        assert metrics["preemptions"] == {source: 1}
        # None was charged: with max_closure_retries=0 a charged one would have failed.
        assert metrics["failed"] == 0
    done = _runs(runs)
    # Every closure ended exactly once.
    assert sorted(i for i, _, _ in done) == list(range(120))
    # Nothing started on the preempted worker a second after the notice (the coordinator
    # learns within one round trip; the worker refuses what arrives meanwhile).
    late = [start - flipped for _, pid, start in done if pid == preempted_pid]
    assert max(late) < 1.0, late
    assert any(pid != preempted_pid for _, pid, _ in done)
    lines = [r.getMessage() for r in warnings if "being preempted" in r.getMessage()]
    assert lines and source in lines[0] and preempted.address in lines[0], lines
    return deadline


def test_a_gce_preemption_notice_moves_the_work_elsewhere_uncharged(tmp_path: Path) -> None:
    preempted, maintenance = _Notice("FALSE"), _Notice("NONE")
    handler = type(
        "Gce",
        (_FakeGce,),
        {"keys": {"instance/preempted": preempted, "instance/maintenance-event": maintenance}},
    )
    with _serving(handler) as host:
        # auto: watches GCE because GCE_METADATA_HOST names a server that answers.
        env = _worker_env(GCE_METADATA_HOST=host, AWS_EC2_METADATA_DISABLED="true")
        with (
            running_worker(["--preemption-notice", "auto"], env=env) as gce,
            running_worker(
                ["--index", "1", "--preemption-notice", "none"], env=_worker_env()
            ) as other,
        ):
            wait_until(lambda: preempted.requests >= 2, "the worker waiting for a change")
            deadline = _notice_moves_work_elsewhere(
                gce, other, lambda: preempted.flip("TRUE"), "gce", tmp_path
            )
            assert deadline == pytest.approx(time.time() + 30, abs=10)
            assert gce.finish() == 0  # drained and exited


def test_a_gce_live_migration_is_no_notice_but_a_terminating_maintenance_is(
    tmp_path: Path,
) -> None:
    preempted, maintenance = _Notice("FALSE"), _Notice("NONE")
    handler = type(
        "Gce",
        (_FakeGce,),
        {"keys": {"instance/preempted": preempted, "instance/maintenance-event": maintenance}},
    )
    with (
        _serving(handler) as host,
        running_worker(
            ["--preemption-notice", "gce"], env=_worker_env(GCE_METADATA_HOST=host)
        ) as worker,
        _busy(worker, tmp_path) as client,
    ):
        wait_until(lambda: maintenance.requests >= 2, "the worker waiting for a change")
        maintenance.flip("MIGRATE_ON_HOST_MAINTENANCE")
        wait_until(lambda: maintenance.requests >= 3, "the worker reading the change")
        assert client.get_status()["state"] == "serving"
        maintenance.flip("TERMINATE_ON_HOST_MAINTENANCE")
        wait_until(lambda: client.get_status()["state"] == "preempting", "preempting")
        report = client.get_status()
        assert report.preemption_source == "gce"
        expected = "instance/maintenance-event=TERMINATE_ON_HOST_MAINTENANCE"
        assert report.preemption_detail == expected


def test_an_ec2_spot_notice_moves_the_work_elsewhere_uncharged(tmp_path: Path) -> None:
    action = _Notice("")
    handler = type("Imds", (_FakeImds,), {"action": action})
    with _serving(handler) as host:
        env = _worker_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=f"http://{host}/")
        args = ["--preemption-notice", "aws", "--preemption-poll", "0.1"]
        with (
            running_worker(args, env=env) as aws,
            running_worker(
                ["--index", "1", "--preemption-notice", "none"], env=_worker_env()
            ) as other,
        ):
            wait_until(lambda: action.requests >= 1, "the worker polling instance-action")
            when = time.gmtime(time.time() + 120)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", when)
            notice = json.dumps({"action": "terminate", "time": stamp})
            deadline = _notice_moves_work_elsewhere(
                aws, other, lambda: action.flip(notice), "aws", tmp_path
            )
            assert deadline == pytest.approx(calendar.timegm(when), abs=1)
            assert aws.finish() == 0


def test_sigterm_is_a_notice_and_still_drains() -> None:
    with running_worker(["--preemption-notice", "signal"]) as worker:
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.finish() == 0
        lines = worker.stderr
    assert re.search(r"a preemption notice reached worker 0 on \S+ \(signal: SIGTERM\)", lines)


def test_the_preemption_signal_is_a_notice_with_the_grace_as_deadline(tmp_path: Path) -> None:
    args = ["--preemption-signal", "USR1", "--preemption-grace", "120"]
    with running_worker(args) as worker:
        with _busy(worker, tmp_path) as client:
            sent = time.time()
            worker.popen.send_signal(signal.SIGUSR1)
            wait_until(lambda: client.get_status()["state"] == "preempting", "preempting")
            report = client.get_status()
            assert report.preemption_source == "signal"
            assert report.preemption_detail == "SIGUSR1"
            assert report.preemption_deadline == pytest.approx(sent + 120, abs=5)
        assert worker.finish() == 0


def test_with_notices_off_sigterm_only_drains() -> None:
    with running_worker(["--preemption-notice", "none"]) as worker:
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.finish() == 0
        assert "preemption notice" not in worker.stderr


def test_a_bad_preemption_signal_is_refused_before_serving() -> None:
    from support.workers import launch

    worker = launch(["--preemption-signal", "NOPE"])
    assert worker.finish() == 2
    assert "--preemption-signal 'NOPE' is not a signal name" in worker.stderr


def test_signal_names_and_ec2_answers_parse() -> None:
    assert signal_number("USR1") == signal.SIGUSR1
    assert signal_number("sigusr2") == signal.SIGUSR2
    assert signal_number("15") == signal.SIGTERM
    with pytest.raises(ValueError, match="not a signal name"):
        signal_number("SIGNOPE")
    parsed = AwsSpotWatch._parse('{"action": "terminate", "time": "2026-11-28T10:00:00Z"}')
    assert parsed is not None and parsed[0] == 1795860000.0
    assert "terminate" in parsed[1]
    assert AwsSpotWatch._parse('{"action": "hibernate"}') is None
    assert AwsSpotWatch._parse("not json") is None


def test_status_shows_who_preempts_and_the_time_left() -> None:
    from jaxcluster.commands.status import Row, render

    row = Row(
        task="worker/0",
        address="10.0.0.5:8470",
        state="preempting",
        details={"preemption_source": "gce", "preemption_deadline": time.time() + 25.4},
    )
    assert "preempting (gce, 25 s left)" in render([row])
    assert not row.serving
