"""Keeps glibc's allocator from handing freed message buffers back to the kernel.

Why: profiling a 16 MiB round trip (perf, ``benches/wire_bench.py``) found a third of its
time in page faults. Every message is received into, and encoded from, fresh buffers of
its size (tonic's, ``Bytes``); glibc returns the freed ones to the kernel (``brk`` and
``madvise`` trimming, or ``munmap`` for chunks above its mmap threshold), so the next
message faults in and zeroes the same pages again, 4,096 of them per 16 MiB. Raising the
mmap threshold to glibc's maximum (32 MiB, which its dynamic threshold reaches by itself
after the first large free) and the trim threshold to 256 MiB keeps that memory mapped for
reuse: at most 256 MiB of freed memory at the top of each arena stays with the process.

Applied in worker and ps processes, and in the coordinator's process when a
``ClusterCoordinator`` is created. Not applied when the user already tuned glibc
(``GLIBC_TUNABLES``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``) or set
``JAXCLUSTER_MALLOC_TUNING=0``, nor on a C library other than glibc.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

_log = logging.getLogger("jaxcluster.malloc")

# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20
_USER_SETTINGS = ("GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")

_lock = threading.Lock()
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Sets glibc's mmap and trim thresholds once per process (see the module docstring);
    returns whether they are set by jaxcluster.

    Example::

        from jaxcluster._malloc import keep_freed_memory
        keep_freed_memory()   # True on glibc unless JAXCLUSTER_MALLOC_TUNING=0
    """
    global _applied
    with _lock:
        if _applied is None:
            _applied = _apply()
        return _applied


def _apply() -> bool:
    if os.environ.get("JAXCLUSTER_MALLOC_TUNING", "1").strip().lower() in ("0", "false", "no"):
        _log.debug("allocator tuning off: JAXCLUSTER_MALLOC_TUNING=0")
        return False
    user = [name for name in _USER_SETTINGS if os.environ.get(name)]
    if user:
        _log.debug("allocator tuning left to the user: %s set", ", ".join(user))
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    _log.debug(
        "allocator tuning: mmap threshold %d, trim threshold %d: %s",
        MMAP_THRESHOLD,
        TRIM_THRESHOLD,
        "set" if ok else "refused",
    )
    return ok
