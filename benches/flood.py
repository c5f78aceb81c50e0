"""Connection flood against a worker: does a client with the token still get answers?

    python benches/flood.py                       # 20,000 idle connections for 10 s
    python benches/flood.py --connections 5000 --seconds 5 --handshake-timeout 60

A worker process is started on 127.0.0.1 with a token. Flooder processes (each holding a
share, since one process's file limit may be lower than the flood) open idle TCP
connections that send nothing, and open a new one whenever the worker closes one, as an
attacker would. While the flood lasts, a client with the token opens a fresh connection and
calls ``GetStatus`` every 100 ms. Reported: the flood actually held open, ``GetStatus``
latency (p50, max) before and during the flood, the worker's CPU use (cores) during the
flood, and its RSS before, during and after. Issue 16's goal: answers within 1 s, < 0.2
cores.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

TOKEN = "flood-token"


def flooder(address: str, count: int) -> None:
    """Keeps ``count`` idle connections to ``address`` open until stdin closes."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
    host, port = address.rsplit(":", 1)
    selector = selectors.DefaultSelector()
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()

    def connect() -> None:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, int(port)))
        selector.register(s, selectors.EVENT_READ)

    for _ in range(count):
        connect()
    print("ready", flush=True)
    reopened = 0
    while not done.is_set():
        for key, _ in selector.select(timeout=0.2):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:  # closed by the worker: open another
                selector.unregister(s)
                s.close()
                connect()
                reopened += 1
    print(f"reopened {reopened}", flush=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def latencies(address: str, until: float) -> list[float]:
    from jaxcluster._native import core

    seen = []
    while time.monotonic() < until:
        start = time.perf_counter()
        core.WorkerClient(address, auth_token=TOKEN).get_status(timeout=30.0)
        seen.append(time.perf_counter() - start)
        threading.Event().wait(0.1)
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--flooders", type=int, default=4)
    parser.add_argument("--handshake-timeout", type=float, default=5.0)
    parser.add_argument("--flooder", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flooder:
        flooder(args.flooder[0], int(args.flooder[1]))
        return 0
    env = {**os.environ, "JAXCLUSTER_AUTH_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "jaxcluster.worker", "--address", "127.0.0.1:0",
         "--handshake-timeout", str(args.handshake_timeout)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        match = re.match(r"^jaxcluster worker listening on (\S+)$", worker.stdout.readline())
        assert match, "the worker did not start"
        address = match.group(1)
        before = latencies(address, time.monotonic() + 2.0)
        rss_before = rss_mib(worker.pid)
        share = args.connections // args.flooders
        flooders = [
            subprocess.Popen(
                [sys.executable, __file__, "--flooder", address, str(share)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(args.flooders)
        ]
        for f in flooders:
            assert f.stdout is not None and f.stdout.readline().strip() == "ready"
        cpu0, t0 = cpu_seconds(worker.pid), time.monotonic()
        during = latencies(address, t0 + args.seconds)
        cores = (cpu_seconds(worker.pid) - cpu0) / (time.monotonic() - t0)
        rss_during = rss_mib(worker.pid)
        from jaxcluster._native import core

        status = core.WorkerClient(address, auth_token=TOKEN).get_status()
        reopened = 0
        for f in flooders:
            out, _ = f.communicate("", timeout=120)
            reopened += int(out.split()[-1])
        threading.Event().wait(2.0)
        rss_after = rss_mib(worker.pid)
        ms = lambda xs: f"p50 {statistics.median(xs) * 1e3:.1f} ms, max {max(xs) * 1e3:.1f} ms"  # noqa: E731
        print(f"flood: {share * args.flooders} idle connections for {args.seconds:.0f} s")
        print(f"GetStatus before: {ms(before)}; during: {ms(during)} ({len(during)} calls)")
        print(f"worker CPU during the flood: {cores:.2f} cores")
        print(
            f"worker RSS: {rss_before:.0f} MiB before, {rss_during:.0f} MiB during, "
            f"{rss_after:.0f} MiB after"
        )
        print(
            f"connections open at the end: {status['connections_open']}, closed by the "
            f"worker: {status['connections_dropped']}; flooders reopened {reopened}"
        )
    finally:
        worker.kill()
        worker.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
