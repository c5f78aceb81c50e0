"""Who wakes whom, and how often, around a loop of round trips: per thread of the given
processes, context switches and CPU from ``/proc/<pid>/task/<tid>/`` (any Linux), and with
``perf sched`` (root) each wake-up's waker and the time a woken thread waited for a core.

Used by ``latency_bench.py``; ``python benches/latency_bench.py --perf`` prints both.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def _perf_command(ctl: int, ack: int, word: bytes, deadline: float) -> bool:
    """Sends ``word`` on perf's control fifo; whether perf acknowledged it by ``deadline``."""
    os.write(ctl, word + b"\n")
    while time.monotonic() < deadline:
        ready, _, _ = select.select([ack], [], [], max(0.0, deadline - time.monotonic()))
        if ready and os.read(ack, 16).startswith(b"ack"):
            return True
    return False


def perf_sched(
    round_trip: Callable[[int], Any], pids: dict[str, int], n: int, folder: str
) -> dict | None:
    """Per thread of ``pids``: switch-ins, scheduling delay (woken -> running) and run time
    over ``n`` calls of ``round_trip``, from ``perf sched`` (needs perf and root); None without.

    perf starts disabled and records exactly the round trips (its ``--control`` fifos).
    """
    path, ctl_path, ack_path = (os.path.join(folder, name) for name in ("data", "ctl", "ack"))
    os.mkfifo(ctl_path)
    os.mkfifo(ack_path)
    command = ["perf", "sched", "record", "-a", "-D", "-1", "-o", path]
    command += ["--control", f"fifo:{ctl_path},{ack_path}"]
    try:
        perf = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    ack = ctl = None
    try:
        deadline = time.monotonic() + 20
        ack = os.open(ack_path, os.O_RDONLY | os.O_NONBLOCK)
        while ctl is None and perf.poll() is None and time.monotonic() < deadline:
            try:
                ctl = os.open(ctl_path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # perf has not opened its end yet
                time.sleep(0.01)
        if ctl is None or not _perf_command(ctl, ack, b"enable", deadline):
            return None
        for i in range(n):
            round_trip(i)
        _perf_command(ctl, ack, b"disable", time.monotonic() + 20)
    finally:  # never leave a system-wide recorder running
        perf.send_signal(signal.SIGINT)
        try:
            perf.wait(timeout=30)
        except subprocess.TimeoutExpired:
            perf.kill()
            perf.wait()
        for fd in (ack, ctl):
            if fd is not None:
                os.close(fd)
    lines = subprocess.run(
        ["perf", "sched", "timehist", "-w", "-i", path],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    return parse_timehist(lines, {pid: process for process, pid in pids.items()}, n)


def _whose(task: str, processes: dict[int, str]) -> tuple[str, str] | None:
    """``name[tid/pid]`` -> (process, thread name) for a thread of ours, else None."""
    name, _, ids = task.rpartition("[")
    tid, _, pid = ids.rstrip("]").partition("/")
    if not tid.isdigit():
        return None
    process = processes.get(int(pid or tid))
    return None if process is None else (process, name)


def parse_timehist(lines: list[str], processes: dict[int, str], n: int) -> dict:
    """Per round trip: per thread (switch-ins, scheduling delay us, run us), and wake-ups by
    who woke whom (``waker -> wakee``, by process and thread name)."""
    threads: dict[tuple[str, str], list[float]] = {}
    wakes: dict[str, float] = {}
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        if "awakened:" in parts:
            wakee = _whose(parts[-1], processes)
            if wakee is not None:
                waker = _whose(parts[2], processes)
                who = "/".join(waker) if waker else "another task (softirq, idle)"
                key = f"{who} -> {'/'.join(wakee)}"
                wakes[key] = wakes.get(key, 0.0) + 1 / n
            continue
        if len(parts) < 6 or not parts[-1][0].isdigit():
            continue
        thread = _whose(parts[2], processes)
        if thread is None:
            continue
        key = (thread[0], parts[2].split("/")[0].rstrip("]") + "]")
        row = threads.setdefault(key, [0.0, 0.0, 0.0])
        row[0] += 1 / n
        row[1] += float(parts[-2]) * 1e3 / n  # sch delay, ms -> us
        row[2] += float(parts[-1]) * 1e3 / n  # run time
    return {"threads": threads, "wakes": wakes}


def thread_counters(pid: int) -> dict[str, tuple[int, int, float]]:
    """Per thread name: voluntary and involuntary context switches, CPU seconds."""
    counters: dict[str, tuple[int, int, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        name = fields["Name"].strip()
        rest = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(rest[11]) + int(rest[12])) / _TICK
        old = counters.get(name, (0, 0, 0.0))
        counters[name] = (
            old[0] + int(fields["voluntary_ctxt_switches"]),
            old[1] + int(fields["nonvoluntary_ctxt_switches"]),
            old[2] + cpu,
        )
    return counters


def snapshot(pids: dict[str, int]) -> dict[tuple[str, str], tuple[int, int, float]]:
    return {
        (process, thread): value
        for process, pid in pids.items()
        for thread, value in thread_counters(pid).items()
    }


def delta(
    before: dict[tuple[str, str], tuple[int, int, float]],
    after: dict[tuple[str, str], tuple[int, int, float]],
) -> dict[tuple[str, str], tuple[int, int, float]]:
    out = {}
    for key, (vol, invol, cpu) in after.items():
        old = before.get(key, (0, 0, 0.0))
        out[key] = (vol - old[0], invol - old[1], cpu - old[2])
    return out


def wakeups_per_round_trip(round_trip: Callable[[int], Any], pids: dict[str, int], n: int) -> dict:
    """Context switches over ``n`` calls of ``round_trip``, by process and thread name."""
    before = snapshot(pids)
    for i in range(n):
        round_trip(i)
    return delta(before, snapshot(pids))


def idle_cpu(pids: dict[str, int], seconds: float = 5.0) -> dict[str, tuple[float, float]]:
    """Per process: % of one core and wake-ups/s over ``seconds`` with nothing scheduled."""
    before = snapshot(pids)
    time.sleep(seconds)
    moved = delta(before, snapshot(pids))
    out: dict[str, tuple[float, float]] = {}
    for (process, _), (vol, invol, cpu) in moved.items():
        pct, wakes = out.get(process, (0.0, 0.0))
        out[process] = (pct + cpu / seconds * 100, wakes + (vol + invol) / seconds)
    return out


def _processes() -> dict[int, tuple[int, str, float]]:
    """Every process: its parent, name and CPU seconds so far."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2 :].split()
        out[int(entry.name)] = (int(rest[1]), name, (int(rest[11]) + int(rest[12])) / _TICK)
    return out


def _descendants(root: int, table: dict[int, tuple[int, str, float]]) -> set[int]:
    found, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _, _) in table.items() if ppid == parent]
        found.update(children)
        frontier.extend(children)
    return found


def tree_idle_cpu(root: int, seconds: float = 5.0) -> dict[str, float]:
    """% of one core used over ``seconds`` by ``root`` and every process below it (a Ray
    driver's ``gcs_server``, ``raylet`` and actors are its descendants), by process name."""
    before = _processes()
    time.sleep(seconds)
    after = _processes()
    used: dict[str, float] = {}
    for pid in _descendants(root, after):
        if pid in before and before[pid][1] == after[pid][1]:
            name = after[pid][1]
            used[name] = used.get(name, 0.0) + (after[pid][2] - before[pid][2]) / seconds * 100
    return used
