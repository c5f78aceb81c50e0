"""Preemption notices for ``jaxcluster worker``: ``--preemption-notice``,
``--preemption-signal``, ``--preemption-grace``.

A notice tells the worker it will be taken away soon. The worker then reports state
``preempting`` with the notice's source and deadline (``GetStatus`` and every
``RunClosures`` message), takes no new closure, hands its queued ones back unrun and
finishes the running one (``WorkerServer.preempt``); its coordinators run the rest
elsewhere without charging ``max_closure_retries``. Where notices come from:

- ``gce``: the GCE/Cloud TPU metadata server's ``instance/preempted`` (``TRUE``) and
  ``instance/maintenance-event`` (``TERMINATE_ON_HOST_MAINTENANCE``; a live migration is not
  a notice), watched with ``?wait_for_change=true``; host as google-auth finds it
  (``GCE_METADATA_HOST``, ``GCE_METADATA_IP``, ``metadata.google.internal``). GCE gives 30 s
  (preemption) or 60 s (maintenance).
- ``aws``: EC2 IMDSv2 ``spot/instance-action`` (404 until a notice, then
  ``{"action": "terminate", "time": "..."}``: the deadline), polled every
  ``--preemption-poll`` seconds; endpoint ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` as botocore
  reads it (default ``http://169.254.169.254/``), off with ``AWS_EC2_METADATA_DISABLED=true``.
- ``signal``: SIGTERM (Kubernetes, systemd, GCE's shutdown) in every mode but ``none``, and
  ``--preemption-signal`` (e.g. ``USR1`` for Slurm's ``--signal=B:USR1@120``); the deadline is
  ``--preemption-grace`` seconds after it (default 30, Kubernetes' default grace period).

``auto`` (the default) watches each metadata server that answers a quick probe, and signals.

Example::

    jaxcluster worker --preemption-notice auto                  # GCE, EC2 or neither
    jaxcluster worker --preemption-signal USR1 --preemption-grace 120   # under Slurm
"""

from __future__ import annotations

import argparse
import calendar
import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from types import FrameType
from typing import Any

from jaxcluster.cluster_resolver._tpu_metadata import is_running_in_gce, metadata_host

__all__ = [
    "MODES",
    "AwsSpotWatch",
    "GceWatch",
    "PreemptionWatch",
    "add_preemption_arguments",
    "signal_number",
]

_log = logging.getLogger("jaxcluster.worker")

#: ``--preemption-notice`` choices.
MODES = ("auto", "gce", "aws", "signal", "none")
#: Seconds GCE gives between its notice and the VM stopping: preemption, maintenance.
GCE_PREEMPTION_SECONDS = 30.0
GCE_MAINTENANCE_SECONDS = 60.0
#: How long ``auto`` waits for a metadata server to answer before deciding there is none.
PROBE_SECONDS = 1.0
#: Longest one ``wait_for_change`` request hangs before the watch asks again.
GCE_WAIT_SECONDS = 30
#: The EC2 metadata endpoint when ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` is not set.
AWS_DEFAULT_ENDPOINT = "http://169.254.169.254/"
#: Seconds an IMDSv2 token lives (renewed well before).
AWS_TOKEN_TTL = 21600

#: Called with (source, deadline in seconds since the epoch or 0, detail).
Notify = Callable[[str, float, str], Any]


def add_preemption_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the preemption flags to ``parser``."""
    group = parser.add_argument_group(
        "preemption notices",
        "on a notice the worker reports 'preempting', takes no new closure, hands queued "
        "ones back and finishes the running one; coordinators run the rest elsewhere "
        "without charging retries",
    )
    group.add_argument(
        "--preemption-notice",
        choices=MODES,
        default="auto",
        help="where notices come from: auto (default: the GCE/TPU metadata server or EC2 "
        "IMDSv2 where one answers, and signals), gce, aws, signal (SIGTERM and "
        "--preemption-signal only), none (SIGTERM only drains)",
    )
    group.add_argument(
        "--preemption-signal",
        metavar="SIG",
        default=None,
        help="a signal that is a notice too, e.g. USR1 for Slurm's --signal=B:USR1@120",
    )
    group.add_argument(
        "--preemption-grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="deadline of a signal's notice, in seconds after it arrives (default 30: "
        "Kubernetes' terminationGracePeriodSeconds; 120 for --signal=B:USR1@120)",
    )
    group.add_argument(
        "--preemption-poll",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often EC2's spot instance-action is read (default 5, as AWS advises)",
    )


def signal_number(name: str) -> int:
    """``"USR1"``, ``"SIGUSR1"`` or ``"10"`` as a signal number; ``ValueError`` otherwise."""
    text = name.strip().upper()
    if text.isdigit():
        return int(signal.Signals(int(text)))
    try:
        return int(signal.Signals[text if text.startswith("SIG") else f"SIG{text}"])
    except KeyError:
        raise ValueError(
            f"--preemption-signal {name!r} is not a signal name; expected e.g. USR1 or SIGUSR2"
        ) from None


def _get(url: str, headers: dict[str, str], timeout: float, method: str = "GET") -> Any:
    """One request to a link-local metadata server, never through a proxy."""
    request = urllib.request.Request(url, headers=headers, method=method)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return opener.open(request, timeout=timeout)


class _Watch:
    """A daemon thread running ``_watch`` until :meth:`stop`."""

    name = "watch"

    def __init__(self, notify: Notify) -> None:
        self._notify = notify
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"jaxcluster-preemption-{self.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:  # a watcher must never take the worker down
            _log.exception("the %s preemption watch stopped", self.name)

    def _watch(self) -> None:
        raise NotImplementedError


class GceWatch(_Watch):
    """Watches ``instance/preempted`` and ``instance/maintenance-event`` (one thread each
    key, long-polled with ``wait_for_change``); ``probe``: give up quietly if the server
    does not answer (``auto``).

    Example::

        GceWatch(server.preempt, probe=True).start()
    """

    name = "gce"

    def __init__(self, notify: Notify, *, probe: bool = False) -> None:
        super().__init__(notify)
        self._probe = probe
        self.host, self.host_source = metadata_host()

    def _watch(self) -> None:
        if self._probe and not (
            os.environ.get("GCE_METADATA_HOST") or is_running_in_gce(PROBE_SECONDS)
        ):
            return
        _log.info(
            "watching the GCE metadata server at %s (%s) for preemption notices",
            self.host,
            self.host_source,
        )
        other = threading.Thread(
            target=self._key,
            args=("instance/maintenance-event",),
            name="jaxcluster-preemption-gce-maintenance",
            daemon=True,
        )
        other.start()
        self._key("instance/preempted")

    def _key(self, key: str) -> None:
        etag = ""
        failures = 0
        while not self._stop.is_set():
            query = f"?wait_for_change=true&timeout_sec={GCE_WAIT_SECONDS}" if etag else ""
            if etag:
                query += f"&last_etag={etag}"
            url = f"http://{self.host}/computeMetadata/v1/{key}{query}"
            try:
                with _get(url, {"Metadata-Flavor": "Google"}, GCE_WAIT_SECONDS + 10) as answer:
                    value = answer.read().decode("utf-8", "replace").strip()
                    etag = answer.headers.get("ETag", "") or etag or "0"
                failures = 0
            except (OSError, ValueError) as exc:
                failures += 1
                if failures == 3:
                    _log.warning("the GCE metadata server does not answer %s: %s", key, exc)
                self._stop.wait(min(30.0, 0.5 * 2**failures))
                continue
            if self._is_notice(key, value):
                seconds = (
                    GCE_PREEMPTION_SECONDS if key.endswith("preempted") else GCE_MAINTENANCE_SECONDS
                )
                self._notify("gce", time.time() + seconds, f"{key}={value}")
                return

    @staticmethod
    def _is_notice(key: str, value: str) -> bool:
        if key.endswith("preempted"):
            return value.upper() == "TRUE"
        # NONE, MIGRATE_ON_HOST_MAINTENANCE (the VM keeps running), TERMINATE_ON_HOST_...
        return value.upper().startswith("TERMINATE")


class AwsSpotWatch(_Watch):
    """Polls EC2's ``spot/instance-action`` through IMDSv2 every ``poll`` seconds;
    ``probe``: give up quietly if no token is granted (``auto``).

    Example::

        AwsSpotWatch(server.preempt, poll=5.0, probe=True).start()
    """

    name = "aws"

    def __init__(self, notify: Notify, *, poll: float = 5.0, probe: bool = False) -> None:
        super().__init__(notify)
        self._poll = poll
        self._probe = probe
        endpoint = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "").strip()
        self.endpoint = (endpoint or AWS_DEFAULT_ENDPOINT).rstrip("/") + "/"
        self._token = ""
        self._token_until = 0.0

    def _token_now(self, timeout: float) -> str:
        if time.monotonic() >= self._token_until:
            with _get(
                f"{self.endpoint}latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL)},
                timeout,
                method="PUT",
            ) as answer:
                self._token = answer.read().decode().strip()
            self._token_until = time.monotonic() + AWS_TOKEN_TTL / 2
        return self._token

    def _watch(self) -> None:
        if os.environ.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true":
            return
        if self._probe:
            try:
                self._token_now(PROBE_SECONDS)
            except (OSError, ValueError):
                return
        _log.info("watching EC2 IMDSv2 at %s for spot interruption notices", self.endpoint)
        failures = 0
        while not self._stop.is_set():
            try:
                token = self._token_now(5.0)
                with _get(
                    f"{self.endpoint}latest/meta-data/spot/instance-action",
                    {"X-aws-ec2-metadata-token": token},
                    5.0,
                ) as answer:
                    body = answer.read().decode("utf-8", "replace")
                failures = 0
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    self._token_until = 0.0  # the token expired: ask for another
                elif exc.code != 404:  # 404: no notice yet
                    failures += 1
                self._stop.wait(self._poll)
                continue
            except (OSError, ValueError) as exc:
                failures += 1
                if failures == 3:
                    _log.warning("EC2 IMDSv2 does not answer spot/instance-action: %s", exc)
                self._stop.wait(self._poll)
                continue
            notice = self._parse(body)
            if notice is not None:
                self._notify("aws", *notice)
                return
            self._stop.wait(self._poll)

    @staticmethod
    def _parse(body: str) -> tuple[float, str] | None:
        """``(deadline, detail)`` from an instance-action answer; ``None`` if it is none."""
        try:
            action = json.loads(body)
        except ValueError:
            return None
        if not isinstance(action, dict) or action.get("action") not in ("terminate", "stop"):
            return None
        when = str(action.get("time", ""))
        try:
            deadline = float(calendar.timegm(time.strptime(when, "%Y-%m-%dT%H:%M:%SZ")))
        except ValueError:
            deadline = time.time() + 120.0  # EC2's documented two minutes
        return deadline, f"spot/instance-action {action['action']} at {when}"


class PreemptionWatch:
    """Every notice source ``args`` asks for, reporting to ``server.preempt``.

    Install from the main thread (it sets signal handlers). SIGINT stays a plain drain.

    Example::

        watch = PreemptionWatch(server, args)
        watch.start()
        ...                 # serve
        watch.stop()
    """

    def __init__(self, server: Any, args: argparse.Namespace) -> None:
        self._server = server
        mode = getattr(args, "preemption_notice", "auto")
        self._mode = mode
        self._grace = float(getattr(args, "preemption_grace", 30.0))
        extra = getattr(args, "preemption_signal", None)
        self._signal = signal_number(extra) if extra else None
        poll = float(getattr(args, "preemption_poll", 5.0))
        self._watches: list[_Watch] = []
        if mode in ("auto", "gce"):
            self._watches.append(GceWatch(self._notify, probe=mode == "auto"))
        if mode in ("auto", "aws"):
            self._watches.append(AwsSpotWatch(self._notify, poll=poll, probe=mode == "auto"))

    def _notify(self, source: str, deadline: float, detail: str) -> None:
        self._server.preempt(source, deadline, detail)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Nothing here logs: the server logs from its own runtime.
        name = signal.Signals(signum).name
        self._server.preempt("signal", time.time() + self._grace, name)

    def start(self) -> None:
        """Installs the signal handlers and starts the metadata watches."""
        if self._mode != "none":
            signal.signal(signal.SIGTERM, self._on_signal)
            if self._signal is not None:
                signal.signal(self._signal, self._on_signal)
        for watch in self._watches:
            watch.start()

    def stop(self) -> None:
        """Stops the metadata watches (their threads are daemons: nothing waits on them)."""
        for watch in self._watches:
            watch.stop()
