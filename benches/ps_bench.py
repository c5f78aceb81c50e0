"""assign_add throughput and latency: jaxcluster's Rust ps vs a pure-Python grpcio ps.

For each variable (a float32 scalar, and a 1 MiB float32 vector) and each server
(``python -m jaxcluster.ps``, and ``ps_grpc_baseline.py``), two client processes call
``assign_add`` back to back for ``--seconds``; jaxcluster's clients use
``jaxcluster._core.PsClient``, the baseline's the grpcio stub. Reported: total updates/s,
per-call latency p50/p99, and the ratio jaxcluster / baseline. The final value is read back
and checked against the number of updates, so neither side may drop one.

    python benches/ps_bench.py                 # build with `maturin develop --release` first
    python benches/ps_bench.py --seconds 3 --clients 2
    python benches/ps_bench.py --only apply --rounds 3     # apply_gradients vs the echo

``apply_gradients`` (issue 27): one coordinator-side caller updates a 1 MiB and a 64 MiB
float32 variable with ``Adam`` and ``SGD`` through a ``ParameterServerStrategy``, back to
back, interleaved round by round with a TCP exchange of the same gradient bytes over the
same loopback (``tcp_echo.py`` in ``ack`` mode: bytes in, 8 bytes back, the shape of an
update). Adam runs twice: from a numpy gradient (copied once on the way out, since another
thread could write it) and from a ``jax.Array`` (``Adam jax``: sent from its own memory).
Reported per configuration: updates/s and gradient MB/s as a min-max range over
the rounds, the ratio to the echo's bandwidth measured in the same round (Adam also with
``compression="bf16"`` and ``"int8"``, its MB/s counted in fp32 gradient bytes), and the
bytes the ps received per update (its ``bytes_written`` counter) with each compression.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
TOKEN = "ps-bench-token"
SIZES = {"scalar": (), "1MiB": (262144,)}

_CLIENT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    impl, address, name, shape, seconds = sys.argv[1:6]
    shape = tuple(json.loads(shape))
    if impl == "jaxcluster":
        from jaxcluster._native import core
        client = core.PsClient(address, auth_token=%(token)r)
    else:
        sys.path.insert(0, %(here)r)
        from ps_grpc_baseline import BaselineClient
        client = BaselineClient(address)
    delta = np.ones(shape, np.float32)
    client.assign_add(name, delta)  # connect and warm up
    print("ready", flush=True)
    sys.stdin.readline()
    latencies = []
    end = time.perf_counter() + float(seconds)
    while True:
        start = time.perf_counter()
        if start >= end:
            break
        client.assign_add(name, delta)
        latencies.append(time.perf_counter() - start)
    print(json.dumps({"ops": len(latencies) + 1, "latencies": latencies}), flush=True)
    """
) % {"token": TOKEN, "here": str(HERE)}


def start_server(impl: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "JAXCLUSTER_AUTH_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    if impl == "jaxcluster":
        command = [sys.executable, "-m", "jaxcluster.ps", "--address", "127.0.0.1:0"]
    else:
        command = [sys.executable, str(HERE / "ps_grpc_baseline.py"), "--address", "127.0.0.1:0"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert server.stdout is not None
    line = server.stdout.readline()
    match = re.search(r"listening on (\S+)", line)
    if match is None:
        server.kill()
        raise RuntimeError(f"{impl} server did not start: {line!r}")
    return server, match.group(1)


def make_client(impl: str, address: str) -> Any:
    if impl == "jaxcluster":
        from jaxcluster._native import core

        return core.PsClient(address, auth_token=TOKEN)
    sys.path.insert(0, str(HERE))
    from ps_grpc_baseline import BaselineClient

    return BaselineClient(address)


def run(impl: str, size: str, clients: int, seconds: float) -> dict[str, float]:
    server, address = start_server(impl)
    try:
        shape = SIZES[size]
        make_client(impl, address).create_variable(size, np.zeros(shape, np.float32))
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _CLIENT,
                    impl,
                    address,
                    size,
                    json.dumps(shape),
                    str(seconds),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(clients)
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.communicate(timeout=seconds + 120)[0]) for p in procs]
        ops = sum(r["ops"] for r in results)
        final = make_client(impl, address).read(size)
        if not np.all(final == ops):
            raise AssertionError(f"{impl}: {ops} updates but the variable holds {final.flat[0]}")
        latencies = np.array([x for r in results for x in r["latencies"]])
        return {
            "updates_per_s": (ops - clients) / seconds,
            "p50_us": float(np.percentile(latencies, 50) * 1e6),
            "p99_us": float(np.percentile(latencies, 99) * 1e6),
        }
    finally:
        server.terminate()
        server.wait(timeout=30)


APPLY_SIZES = {"1MiB": 1 << 18, "64MiB": 1 << 24}  # float32 elements


def _timed(step: Any, seconds: float) -> float:
    """Calls ``step`` back to back for about ``seconds`` (at least twice); calls per second."""
    step()  # warm up (connection, first allocation of slots)
    count, started = 0, time.perf_counter()
    while count < 2 or time.perf_counter() - started < seconds:
        step()
        count += 1
    return count / (time.perf_counter() - started)


def _ps_bytes_written(address: str) -> int:
    from jaxcluster._native import core

    return int(core.PsClient(address, auth_token=TOKEN).get_status()["bytes_written"])


def _as_jax(array: np.ndarray) -> Any:
    """``array`` as a ``jax.Array`` on this process's (CPU) backend, as ``jax.grad`` gives."""
    import jax

    return jax.device_put(array, jax.devices("cpu")[0])


def run_apply(seconds: float, rounds: int) -> None:
    """``apply_gradients`` against the ``ack`` echo of the same bytes, interleaved."""
    from jaxcluster.cluster_resolver import SimpleClusterResolver
    from jaxcluster.cluster_spec import ClusterSpec
    from jaxcluster.strategy import ParameterServerStrategy
    from jaxcluster.strategy import optimizers as opt

    sys.path.insert(0, str(HERE))
    from tcp_echo import ACK, EchoClient, EchoServer

    server, address = start_server("jaxcluster")
    try:
        resolver = SimpleClusterResolver(
            ClusterSpec({"ps": [address], "worker": ["127.0.0.1:1"]}), rpc_layer="grpc"
        )
        # The worker job is required by the strategy; only the ps is contacted here.
        strategy = ParameterServerStrategy(resolver, auth_token=TOKEN)
        with EchoServer() as port:
            echo = EchoClient(port, ACK)
            print(f"apply_gradients, 1 caller, {rounds} interleaved rounds of {seconds:g} s")
            print(f"{'variable':<8} {'what':<12} {'updates/s':>13} {'MB/s':>15} {'x echo':>11}")
            for size, elements in APPLY_SIZES.items():
                grad = np.random.default_rng(0).normal(size=elements).astype(np.float32)
                mb = grad.nbytes / 1e6
                with strategy.scope():
                    w = strategy.Variable(np.zeros(elements, np.float32), name=f"w_{size}")
                # label -> (optimizer, compression, gradient); the ratio is to the fp32
                # bytes' echo. A numpy gradient is copied once on the way out (another
                # thread could write it); a jax.Array's, as jax.grad returns, is not.
                jax_grad = _as_jax(grad)
                optimizers = {
                    "Adam": (opt.Adam(1e-3), None, grad),
                    "Adam jax": (opt.Adam(1e-3, name="Adam_j"), None, jax_grad),
                    "SGD": (opt.SGD(1e-3), None, grad),
                    "Adam bf16": (opt.Adam(1e-3, name="Adam_b"), "bf16", grad),
                    "Adam int8": (opt.Adam(1e-3, name="Adam_i"), "int8", grad),
                }
                rates: dict[str, list[float]] = {"echo": [], **{k: [] for k in optimizers}}
                ratios: dict[str, list[float]] = {k: [] for k in optimizers}
                for _ in range(rounds):
                    rates["echo"].append(_timed(lambda g=grad: echo.round_trip(g), seconds))
                    for label, (optimizer, compression, gradient) in optimizers.items():
                        rate = _timed(
                            lambda o=optimizer, g=gradient, v=w, c=compression: o.apply_gradients(
                                [(g, v)], compression=c
                            ),
                            seconds,
                        )
                        rates[label].append(rate)
                        ratios[label].append(rate / rates["echo"][-1])
                for label, values in rates.items():
                    low, high = min(values), max(values)
                    ratio = ratios.get(label)
                    shown = f"{min(ratio):.2f}-{max(ratio):.2f}" if ratio else ""
                    print(
                        f"{size:<8} {label:<12} {low:>6.1f}-{high:<6.1f} "
                        f"{low * mb:>7.0f}-{high * mb:<7.0f} {shown:>11}"
                    )
                for compression in (None, "bf16", "int8"):
                    adam = opt.Adam(1e-3, name=f"Adam_{compression}")
                    adam.apply_gradients([(grad, w)], compression=compression)
                    before = _ps_bytes_written(address)
                    adam.apply_gradients([(grad, w)], compression=compression)
                    sent = _ps_bytes_written(address) - before
                    print(
                        f"{size:<8} bytes/update compression={compression!s:<5} {sent:>10} "
                        f"({sent / grad.nbytes:.3f} of fp32)"
                    )
            echo.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="apply_gradients rounds")
    parser.add_argument("--only", choices=("assign_add", "apply"), default=None)
    args = parser.parse_args()
    if args.only != "assign_add":
        run_apply(args.seconds, args.rounds)
    if args.only == "apply":
        return 0
    print(f"assign_add from {args.clients} client processes, {args.seconds:g} s each run")
    print(f"{'variable':<8} {'server':<11} {'updates/s':>10} {'p50 µs':>9} {'p99 µs':>9}")
    for size in SIZES:
        rows = {
            impl: run(impl, size, args.clients, args.seconds) for impl in ("jaxcluster", "grpcio")
        }
        for impl, r in rows.items():
            print(
                f"{size:<8} {impl:<11} {r['updates_per_s']:>10.0f} {r['p50_us']:>9.0f} "
                f"{r['p99_us']:>9.0f}"
            )
        ratio = rows["jaxcluster"]["updates_per_s"] / rows["grpcio"]["updates_per_s"]
        print(f"{size:<8} ratio jaxcluster/grpcio: {ratio:.1f}x updates/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
