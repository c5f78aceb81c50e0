"""Chaos soak: closures flow through a LocalCluster while its tasks are killed, drained, frozen
and restarted, and every invariant is checked at the end.

    python benches/soak.py 1        # one minute (fractions allowed: 0.5 = 30 s)
    python benches/soak.py 10 --workers 4 --ps 2 --seed 7
    python benches/soak.py 2 --faults term --interval 1   # only drains, one a second

Faults, one at a time, every ``--interval`` seconds, on a random task:

- SIGKILL a worker, then start it again (a crash);
- SIGTERM a worker, wait until it drained and exited, start it again (a preemption);
- SIGSTOP a worker for longer than the heartbeat timeout, then SIGCONT (a hung host);
- every ``--ps-every``-th fault: SIGKILL a ps holding a counter, start it again empty and
  restore the counter from the checkpoint saved before the kill.

Invariants (the run exits 1 naming each one that failed):

- nothing lost: every closure scheduled returned its value (none failed, none cancelled);
- values right: each value is what the closure computes from its arguments;
- at-most-once where promised: TF's execution is at least once, and a closure may run again
  when the process that ran it was SIGKILLed, frozen or declared failed by the coordinator
  (the "lost worker" warning, unless it was for a drain) after it started, since its result
  may never have arrived. A drain (SIGTERM) explains nothing: the drained worker answers
  what it ran and exits only once that answer was acknowledged. Every extra start must be
  explained so: one on a process none of those events followed (e.g. a pipelined closure
  started by a worker whose lease had run out, or one a drained worker ran) fails the run.
  The report counts duplicates per kind of event, and the coordinator's declarations that
  no injected fault explains (a live worker starved of CPU past the heartbeat bound). A
  closure logs its start from inside its function, so one a worker took from its queue just
  before SIGSTOP logs a start just after SIGCONT: a start within ``RESUME_SLACK`` of a
  resumption counts as one before the freeze (the report says how many, and how late);
- checkpoints intact: each restored counter equals the value saved;
- memory flat: the coordinator's RSS grows by less than ``--max-growth-kib`` per 10,000
  closures between the end of the first fifth of the run and the end.

Each closure appends its number and start time to a log of its worker process when it starts
(an ``O_APPEND`` write, kept by the kernel when the process is SIGKILLed next), so
executions by processes that died count too; the chaos thread records each fault's time and
pid, and a log handler records each "lost worker" warning of the coordinator.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from jaxcluster import LocalCluster
from jaxcluster._native import core
from jaxcluster.strategy import checkpoint

HEARTBEAT_TIMEOUT = 2.0


def work(log_dir: str, i: int) -> int:
    """Runs on a worker: logs its start, returns a value the driver can check."""
    fd = os.open(
        os.path.join(log_dir, f"{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
    )
    try:
        os.write(fd, f"{i} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)
    return (i * 2654435761) % 1_000_003


class Declarations(logging.Handler):
    """Records the coordinator's "lost worker ... (worker N)" warnings: (time, index); not
    those of a worker that drained (it promised to answer what it ran)."""

    PATTERN = re.compile(r"^lost worker \S+ \(worker (\d+)\)")
    DRAINED = ("is draining", "is shutting down", "drained and ended")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lost: list[tuple[float, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        match = self.PATTERN.match(message)
        if match and not any(drained in message for drained in self.DRAINED):
            self.lost.append((record.created, int(match.group(1))))


# A declaration explains a start on a process if it comes at most this long after the
# process was replaced (a killed worker's loss may be noticed after its restart began).
DECLARATION_SLACK = 10.0
# A closure a worker took from its queue just before SIGSTOP (its lease still valid) logs its
# start after SIGCONT: a start this soon after the resumption counts as one before the
# freeze. The executor's path from taking a closure to its first line is well under this.
RESUME_SLACK = 0.5


def audit_repeats(
    executions: dict[int, list[tuple[float, int]]], chaos: Chaos, lost: list[tuple[float, int]]
) -> tuple[Counter[str], list[str], int]:
    """Explains each extra start of a closure by an event on the process that ran an earlier
    start, after that start: a fault sent to it, or the coordinator declaring its worker lost.

    Returns the explained extra starts by kind of event, up to 5 unexplained ones described,
    and how many declarations no fault on that worker explains (false suspicions).
    """
    index_of: dict[int, int] = {pid: index for _, index, pid in chaos.lives}
    # When each process was replaced by the next one on its worker index.
    replaced: dict[int, float] = {}
    by_index: dict[int, list[tuple[float, int]]] = {}
    for started, index, pid in sorted(chaos.lives):
        by_index.setdefault(index, []).append((started, pid))
    for lives in by_index.values():
        for (_, pid), (started, _) in itertools.pairwise(lives):
            replaced[pid] = started

    def explanation(start: float, pid: int) -> str | None:
        for when, kind, faulted in chaos.faults:
            # A drain promises to answer the closure it runs: no excuse for a second run.
            if faulted == pid and when >= start and kind != "term":
                return kind
        for resumed, faulted in chaos.resumes:
            if faulted == pid and 0 <= start - resumed <= RESUME_SLACK:
                # Taken from the queue before the freeze, run on resumption.
                after_resume.append(start - resumed)
                return "stop"
        index = index_of.get(pid)
        end = replaced.get(pid, float("inf")) + DECLARATION_SLACK
        for when, lost_index in lost:
            if lost_index == index and start <= when <= end:
                return "declared lost"
        return None

    explained: Counter[str] = Counter()
    unexplained: list[str] = []
    after_resume: list[float] = []
    for closure, runs in executions.items():
        if len(runs) < 2:
            continue
        reasons = [explanation(start, pid) for start, pid in sorted(runs)]
        known = [reason for reason in reasons if reason is not None]
        explained.update(known[: len(runs) - 1])
        if len(known) < len(runs) - 1:
            starts = sorted(runs)
            pids = {pid for _, pid in starts}
            near = [
                (round(when, 6), kind, pid)
                for when, kind, pid in chaos.faults
                if pid in pids and abs(when - starts[0][0]) < 30
            ]
            indices = {pid: index_of.get(pid) for pid in pids}
            unexplained.append(
                f"closure {closure}: starts (time, pid) {starts}; worker index by pid "
                f"{indices}; faults on those pids (time, kind, pid) {near}"
            )
    fault_times: dict[int, list[float]] = {}
    for when, _, pid in chaos.faults:
        if pid in index_of:
            fault_times.setdefault(index_of[pid], []).append(when)
    window = HEARTBEAT_TIMEOUT + 10.0
    suspicions = sum(
        1
        for when, index in lost
        if not any(0 <= when - fault <= window for fault in fault_times.get(index, []))
    )
    if after_resume:
        print(
            f"starts logged after SIGCONT on a process frozen with the closure taken: "
            f"{len(after_resume)}, at most {max(after_resume) * 1000:.1f} ms after it"
        )
    return explained, unexplained, suspicions


def rss_kib() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


class Chaos(threading.Thread):
    """Injects one fault at a time until stopped; counts what it did."""

    def __init__(self, cluster: LocalCluster, args: argparse.Namespace) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.args = args
        self.rng = random.Random(args.seed)
        self.stopped = threading.Event()
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.counter = 0  # the value of the ps counter, as the driver knows it
        # (time, kind, pid) of each SIGKILL / SIGTERM / SIGSTOP sent to a worker
        self.faults: list[tuple[float, str, int]] = []
        # (time, pid) of each SIGCONT ending a freeze
        self.resumes: list[tuple[float, int]] = []
        # (time it started serving, worker index, pid) of every worker process
        self.lives: list[tuple[float, int, int]] = [
            (time.time(), i, pid)
            for i in range(cluster.num_workers)
            if (pid := cluster.worker_pid(i)) is not None
        ]

    def run(self) -> None:
        try:
            while not self.stopped.wait(self.args.interval):
                n = sum(self.counts.values()) + 1
                if self.cluster.num_ps and n % self.args.ps_every == 0:
                    self.ps_fault()
                else:
                    self.worker_fault(self.rng.randrange(self.cluster.num_workers))
        except Exception as exc:  # reported as a failed invariant, never swallowed
            self.errors.append(f"chaos thread: {exc!r}")

    def worker_fault(self, index: int) -> None:
        pid = self.cluster.worker_pid(index)
        if pid is None:
            return
        kind = self.rng.choice(self.args.faults)
        self.faults.append((time.time(), kind, pid))
        if kind == "kill":
            os.kill(pid, signal.SIGKILL)
        elif kind == "term":
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 120
            while self.cluster.worker_pid(index) is not None and time.monotonic() < deadline:
                self.stopped.wait(0.05)
        else:
            os.kill(pid, signal.SIGSTOP)
            # Long enough that the coordinator declares it failed.
            self.stopped.wait(HEARTBEAT_TIMEOUT + self.rng.uniform(1.0, 3.0))
            # Stamped before the signal: the process may run before this thread does again.
            self.resumes.append((time.time(), pid))
            os.kill(pid, signal.SIGCONT)
        if kind != "stop":
            self.cluster.restart_worker(index)
            restarted = self.cluster.worker_pid(index)
            if restarted is not None:
                self.lives.append((time.time(), index, restarted))
        self.counts[kind] += 1

    def ps_fault(self) -> None:
        index = self.rng.randrange(self.cluster.num_ps)
        address = self.cluster.ps_addresses[index]
        token = self.cluster.auth_token
        client = core.PsClient(address, auth_token=token)
        name = "soak_counter"
        step = self.rng.randrange(1, 1000)
        try:
            client.create_variable(name, np.int64(self.counter), replace=True)
            client.assign_add(name, np.int64(step))
            self.counter += step
            path = Path(self.args.work_dir, f"ps{index}.jaxc")
            checkpoint.write_checkpoint(path, {name: client.read(name)})
        finally:
            del client
        self.cluster.kill_ps(index)
        self.cluster.restart_ps(index)
        restored = core.PsClient(address, auth_token=token)
        value = checkpoint.read_checkpoint(path)[name]
        restored.create_variable(name, value)
        if int(restored.read(name)) != self.counter:
            self.errors.append(
                f"ps {index}: restored counter {int(restored.read(name))}, saved {self.counter}"
            )
        self.counts["ps"] += 1


def soak(args: argparse.Namespace) -> int:
    log_dir = Path(args.work_dir, "logs")
    log_dir.mkdir()
    failures: list[str] = []
    scheduled = 0
    values_wrong = 0
    lost: list[str] = []
    memory: list[tuple[float, int, int]] = []  # (elapsed, closures so far, RSS KiB)
    declarations = Declarations()
    logging.getLogger("jaxcluster.dispatch").addHandler(declarations)
    with (
        LocalCluster(args.workers, num_ps=args.ps) as cluster,
        cluster.coordinator(
            error_policy="per_closure", heartbeat_timeout=HEARTBEAT_TIMEOUT
        ) as coordinator,
    ):
        chaos = Chaos(cluster, args)
        start = time.monotonic()
        end = start + args.minutes * 60
        chaos.start()
        while time.monotonic() < end:
            numbers = range(scheduled, scheduled + args.batch)
            rvs = [coordinator.schedule(work, args=(str(log_dir), i)) for i in numbers]
            coordinator.join()
            for i, rv in zip(numbers, rvs, strict=True):
                try:
                    value = rv.fetch()
                except Exception as exc:
                    if len(lost) < 5:
                        lost.append(f"closure {i}: {type(exc).__name__}: {exc}"[:500])
                    else:
                        lost.append("")
                    continue
                if value != (i * 2654435761) % 1_000_003:
                    values_wrong += 1
            scheduled += args.batch
            memory.append((time.monotonic() - start, scheduled, rss_kib()))
        chaos.stopped.set()
        chaos.join(timeout=300)
        elapsed = time.monotonic() - start
    logging.getLogger("jaxcluster.dispatch").removeHandler(declarations)
    executions: dict[int, list[tuple[float, int]]] = {}
    for log in log_dir.iterdir():
        pid = int(log.stem)
        for line in log.read_text().splitlines():
            number, started = line.split()
            executions.setdefault(int(number), []).append((float(started), pid))
    never = [i for i in range(scheduled) if i not in executions]
    twice = sum(1 for runs in executions.values() if len(runs) > 1)
    explained, unexplained, suspicions = audit_repeats(executions, chaos, declarations.lost)
    worker_faults = chaos.counts["kill"] + chaos.counts["stop"] + chaos.counts["term"]
    print(f"{scheduled} closures in {elapsed:.0f} s ({scheduled / elapsed:.0f}/s)")
    print(f"faults: {dict(chaos.counts)} ({sum(chaos.counts.values())} in all)")
    print(
        f"closures started twice or more: {twice} ({worker_faults} worker faults); extra "
        f"starts explained by {dict(explained)}; unexplained: {len(unexplained)}"
    )
    print(
        f"workers declared lost: {len(declarations.lost)}, of which {suspicions} with no "
        f"fault injected on that worker in the {HEARTBEAT_TIMEOUT + 10:.0f} s before"
    )
    if lost:
        failures.append(f"{len(lost)} closures failed or were cancelled: {lost[:5]}")
    if never:
        failures.append(f"{len(never)} closures never started, e.g. {never[:5]}")
    if values_wrong:
        failures.append(f"{values_wrong} closures returned a wrong value")
    if unexplained:
        failures.append(
            f"{len(unexplained)} closures ran again although no process that ran them died, "
            f"froze or was declared lost after starting them: {unexplained[:5]}"
        )
    failures.extend(chaos.errors)
    first = next((m for m in memory if m[0] >= elapsed / 5), None)
    if first is not None and memory[-1][1] > first[1]:
        grown = memory[-1][2] - first[2]
        per_10k = grown * 10_000 / (memory[-1][1] - first[1])
        print(
            f"coordinator RSS: {first[2] / 1024:.1f} MiB at {first[0]:.0f} s, "
            f"{memory[-1][2] / 1024:.1f} MiB at the end: {per_10k:+.1f} KiB per 10k closures"
        )
        if per_10k > args.max_growth_kib:
            failures.append(
                f"memory grew {per_10k:.1f} KiB per 10k closures, above {args.max_growth_kib}"
            )
    for failure in failures:
        print(f"FAILED: {failure}")
    print("soak: " + ("FAILED" if failures else "every invariant held"))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("minutes", type=float, help="how long to run (fractions allowed)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between faults")
    parser.add_argument("--ps-every", type=int, default=5, help="every Nth fault hits a ps")
    parser.add_argument("--batch", type=int, default=2000, help="closures per batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--faults",
        type=lambda text: text.split(","),
        default=["kill", "term", "stop"],
        help="worker faults to choose from, comma-separated (default kill,term,stop)",
    )
    parser.add_argument("--max-growth-kib", type=float, default=256.0)
    args = parser.parse_args(argv)
    if not args.minutes > 0:
        parser.error(f"minutes={args.minutes}; expected a positive number")
    unknown = sorted(set(args.faults) - {"kill", "term", "stop"})
    if unknown or not args.faults:
        parser.error(f"--faults {','.join(args.faults)}; expected some of kill,term,stop")
    with tempfile.TemporaryDirectory(prefix="jaxcluster-soak-") as work_dir:
        args.work_dir = work_dir
        return soak(args)


if __name__ == "__main__":
    sys.exit(main())
