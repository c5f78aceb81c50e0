"""A small HTTP server on 127.0.0.1 for fake Google endpoints, shared by the fakes here.

Each fake subclasses :class:`FakeHTTPServer` and implements :meth:`FakeHTTPServer.handle`,
which maps a recorded :class:`Request` to a :class:`Response`. The base class runs a real
``ThreadingHTTPServer`` on a free port in a background thread, records every request (so
tests can assert what the client called, with which headers), and can inject faults (an
HTTP status for the next N matching requests) or delay every answer (to test timeouts).

Example::

    with FakeComputeServer() as server:
        server.fail_next(500, times=1)
        ...  # point the client at server.url
        assert [r.path for r in server.requests] == [...]
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeHTTPServer", "Request", "Response", "google_error"]


@dataclass(frozen=True)
class Request:
    """One request as the server saw it; header names are lower-cased."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


@dataclass
class Response:
    """What a fake answers: a status, a body (``bytes``, ``str`` or JSON-able) and headers."""

    status: int = 200
    body: Any = b""
    headers: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> tuple[bytes, dict[str, str]]:
        headers = dict(self.headers)
        if isinstance(self.body, bytes):
            data = self.body
        elif isinstance(self.body, str):
            data = self.body.encode()
            headers.setdefault("Content-Type", "text/plain; charset=utf-8")
        else:
            data = json.dumps(self.body).encode()
            headers.setdefault("Content-Type", "application/json; charset=UTF-8")
        return data, headers


_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def google_error(code: int, message: str, **extra: Any) -> dict[str, Any]:
    """The error body Google's JSON APIs send: ``{"error": {"code", "message", "status"}}``."""
    error: dict[str, Any] = {
        "code": code,
        "message": message,
        "status": _STATUS_NAMES.get(code, "UNKNOWN"),
    }
    error.update(extra)
    return {"error": error}


@dataclass
class _Fault:
    status: int
    remaining: int
    path_contains: str
    body: Any
    headers: dict[str, str]


class FakeHTTPServer:
    """Base class of the fakes: start/stop, request log, fault injection, slowness."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.delay: float = 0.0
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- to override ------------------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> FakeHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        server.daemon_threads = True
        self._server = server
        # A short poll interval makes stop() quick; the default (0.5 s) adds up over a suite.
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name=type(self).__name__, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # releases handlers parked in a delay
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        """``127.0.0.1:<port>``, the form ``GCE_METADATA_HOST`` takes."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    # -- test controls ----------------------------------------------------------------------
    def fail_next(
        self,
        status: int,
        *,
        times: int = 1,
        path_contains: str = "",
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next ``times`` requests whose path contains ``path_contains`` with
        ``status`` (and a Google error body unless ``body`` is given)."""
        if body is None:
            body = google_error(status, f"injected failure with HTTP {status}")
        with self._lock:
            self._faults.append(_Fault(status, times, path_contains, body, dict(headers or {})))

    def paths(self) -> list[str]:
        with self._lock:
            return [r.path for r in self.requests]

    # -- internals --------------------------------------------------------------------------
    def _dispatch(self, request: Request) -> Response:
        with self._lock:
            self.requests.append(request)
            fault = next(
                (f for f in self._faults if f.remaining > 0 and f.path_contains in request.path),
                None,
            )
            if fault is not None:
                fault.remaining -= 1
        if self.delay > 0:
            self._stopping.wait(self.delay)
        if fault is not None:
            return Response(fault.status, fault.body, fault.headers)
        try:
            return self.handle(request)
        except Exception as exc:  # a bug in a fake must show up as a failing request
            return Response(500, google_error(500, f"fake server bug: {exc!r}"))


def _make_handler(fake: FakeHTTPServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            headers = {k.lower(): v for k, v in self.headers.items()}
            response = fake._dispatch(Request(self.command, parts.path, query, headers, body))
            data, extra = response.encoded()
            try:
                self.send_response(response.status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                # The client gave up first (a timeout test); nothing left to answer.
                self.close_connection = True

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep pytest output clean

    return Handler
