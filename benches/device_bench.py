"""DeviceSpec.from_string from a Python loop vs a pure-Python `re` parser (target: >= 2M/s).

Both parse the same distinct strings (no string repeats, so nothing can be cached), mixing
the canonical form, shuffled segments, legacy device forms and uncommon job names. Rates are
reported per wall-clock second and per CPU second of this thread: on a shared machine the
second is the steadier figure. Run: ``python benches/device_bench.py [--count N]``.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable

from jaxcluster.devices import DeviceSpec

Fields = tuple[str | None, int | None, int | None, str | None, int | None]

_SEGMENT = re.compile(
    r"job:(?P<job>[^:]*)"
    r"|replica:(?P<replica>\d+)"
    r"|task:(?P<task>\d+)"
    r"|device:(?P<type>[^:]*):(?P<index>\d+|\*)"
    r"|(?P<bare>cpu|gpu|tpu|custom|epu)(?::(?P<bare_index>\d+|\*))?",
    re.IGNORECASE,
)


def parse_with_re(spec: str) -> Fields:
    """The reference: the same grammar in pure Python, one regex match per segment."""
    job: str | None = None
    replica = task = index = None
    kind: str | None = None
    for segment in spec.split("/"):
        if not segment:
            continue
        match = _SEGMENT.fullmatch(segment)
        if match is None:
            raise ValueError(f"bad segment {segment!r} in {spec!r}")
        groups = match.groupdict()
        if groups["job"] is not None:
            job = groups["job"]
        elif groups["replica"] is not None:
            replica = int(groups["replica"])
        elif groups["task"] is not None:
            task = int(groups["task"])
        else:
            if kind is not None:
                raise ValueError(f"multiple device types in {spec!r}")
            if groups["bare"] is not None:
                kind, raw = groups["bare"].upper(), groups["bare_index"]
            else:
                kind, raw = groups["type"], groups["index"]
                kind = kind.upper() if kind in ("cpu", "gpu") else kind
            index = None if raw in (None, "*") else int(raw)
    return job, replica, task, kind, index


def distinct_names(count: int) -> list[str]:
    jobs = ["worker", "ps", "chief", "trainer", "localhost"]
    kinds = ["CPU", "GPU", "TPU", "TPU_SYSTEM"]
    names = []
    for i in range(count):
        job, kind, task, index = jobs[i % 5], kinds[(i // 5) % 4], i // 8, i % 8
        if i % 4 in (0, 1):
            names.append(f"/job:{job}/replica:0/task:{task}/device:{kind}:{index}")
        elif i % 4 == 2:
            names.append(f"/device:{kind}:{index}/task:{task}/job:{job}")
        else:
            names.append(f"/job:{job}{i}/task:{task}/gpu:{index}")
    assert len(set(names)) == count
    return names


def measure(parse: Callable[[str], object], names: list[str], repeats: int) -> tuple[float, float]:
    """Best parses/s over `repeats` passes, by wall clock and by this thread's CPU time."""
    best_wall = best_cpu = 0.0
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.thread_time()
        for name in names:
            parse(name)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        best_wall = max(best_wall, len(names) / wall)
        best_cpu = max(best_cpu, len(names) / max(cpu, 1e-9))
    return best_wall, best_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000, help="distinct names per pass")
    parser.add_argument("--repeats", type=int, default=5, help="passes; the best is kept")
    args = parser.parse_args()

    names = distinct_names(args.count)
    for name in names[:1000]:  # the two parsers must agree before their speeds mean anything
        spec = DeviceSpec.from_string(name)
        mine = (spec.job, spec.replica, spec.task, spec.device_type, spec.device_index)
        assert mine == parse_with_re(name), name

    rust_wall, rust_cpu = measure(DeviceSpec.from_string, names, args.repeats)
    re_wall, re_cpu = measure(parse_with_re, names, args.repeats)
    print(f"{args.count} distinct names, best of {args.repeats} passes (parses/s)")
    print(f"  {'':24}{'wall':>9}{'cpu':>9}")
    for label, wall, cpu in [
        ("DeviceSpec.from_string", rust_wall, rust_cpu),
        ("pure-Python re parser", re_wall, re_cpu),
    ]:
        print(f"  {label:24}{wall / 1e6:8.2f}M{cpu / 1e6:8.2f}M")
    print(f"  {'ratio':24}{rust_wall / re_wall:8.1f}x{rust_cpu / re_cpu:8.1f}x")
    verdict = "met" if rust_wall >= 2e6 else "MISSED"
    print(f"  target >= 2M/s (wall): {verdict}")


if __name__ == "__main__":
    main()
