"""The baseline of ``wire_bench.py``: a plain TCP echo of the same bytes over loopback.

A server process reads messages framed as an 8-byte little-endian length and a flag byte
followed by the payload, straight into one preallocated buffer, and answers with the
whole message (``echo``) or with an 8-byte acknowledgement (``ack``, the shape of a ps
update: bytes in, a few bytes out). The client sends from the caller's buffer and receives
into a preallocated one, so neither side copies in user space: what is left is what the
kernel's loopback costs, the limit any RPC stack on this machine works against.

    python benches/tcp_echo.py 16777216          # one echo client, median round trip
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from typing import Any

_HEADER = struct.Struct("<QB")
ECHO, ACK = 0, 1
#: pid of the server process listening on each port, for CPU accounting.
SERVERS: dict[int, int] = {}


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


def _serve_connection(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    header = bytearray(_HEADER.size)
    buffer = bytearray(0)
    while True:
        try:
            _recv_into(conn, memoryview(header))
        except ConnectionError:
            return
        size, mode = _HEADER.unpack(header)
        if len(buffer) < size:
            buffer = bytearray(size)
        view = memoryview(buffer)[:size]
        _recv_into(conn, view)
        if mode == ECHO:
            conn.sendall(view)
        else:
            conn.sendall(struct.pack("<Q", size))


def serve() -> None:
    """Runs the server: prints its port, serves each connection in a thread."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_connection, args=(conn,), daemon=True).start()


class EchoServer:
    """The server as a subprocess (like a worker), for ``with EchoServer() as port:``."""

    def __enter__(self) -> int:
        self._process = subprocess.Popen(
            [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdout is not None
        port = int(self._process.stdout.readline())
        SERVERS[port] = self._process.pid
        return port

    def __exit__(self, *exc: Any) -> None:
        self._process.kill()
        self._process.wait()


class EchoClient:
    """One connection; ``round_trip(data)`` sends ``data`` and waits for its answer."""

    def __init__(self, port: int, mode: int = ECHO) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._mode = mode
        self._answer = bytearray(0)

    def round_trip(self, data: Any) -> memoryview:
        payload = memoryview(data).cast("B")
        size = len(payload)
        self._sock.sendall(_HEADER.pack(size, self._mode))
        self._sock.sendall(payload)
        expected = size if self._mode == ECHO else 8
        if len(self._answer) < expected:
            self._answer = bytearray(expected)
        answer = memoryview(self._answer)[:expected]
        _recv_into(self._sock, answer)
        return answer

    def pipelined(self, data: Any, seconds: float, depth: int = 16) -> int:
        """Echoes ``data`` for ``seconds`` with up to ``depth`` messages in flight (a thread
        sends, the caller's receives), as a coordinator link keeps closures queued on its
        worker; returns how many came back in time."""
        import threading

        payload = memoryview(data).cast("B")
        size = len(payload)
        slots = threading.Semaphore(depth)
        stop = threading.Event()
        sent = [0]

        def send() -> None:
            header = _HEADER.pack(size, ECHO)
            while not stop.is_set():
                if slots.acquire(timeout=0.1):
                    self._sock.sendall(header)
                    self._sock.sendall(payload)
                    sent[0] += 1

        sender = threading.Thread(target=send, daemon=True)
        answer = memoryview(bytearray(size))
        end = time.perf_counter() + seconds
        done = 0
        sender.start()
        while time.perf_counter() < end:
            _recv_into(self._sock, answer)
            slots.release()
            done += 1
        stop.set()
        sender.join()
        for _ in range(sent[0] - done):  # what is still in flight
            _recv_into(self._sock, answer)
        return done

    def close(self) -> None:
        self._sock.close()


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    import numpy as np

    size = int(sys.argv[1]) if len(sys.argv) > 1 else 16 << 20
    data = np.ones(size // 4, np.float32)
    with EchoServer() as port:
        client = EchoClient(port)
        times = []
        for _ in range(30):
            started = time.perf_counter()
            client.round_trip(data)
            times.append(time.perf_counter() - started)
        print(f"echo {size} bytes: median {np.median(times[3:]) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
