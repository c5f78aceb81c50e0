"""The allocator tuning that keeps large message buffers mapped (``jaxcluster._malloc``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "import json, os; from jaxcluster import _malloc; "
    "print(json.dumps(_malloc.keep_freed_memory()))"
)


def _probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES",)}
    clean.pop("JAXCLUSTER_MALLOC_TUNING", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_tuning_is_applied_on_glibc_unless_turned_off_or_left_to_the_user() -> None:
    glibc = bool(os.confstr("CS_GNU_LIBC_VERSION"))
    assert _probe() == ("true" if glibc else "false")
    assert _probe(JAXCLUSTER_MALLOC_TUNING="0") == "false"
    assert _probe(GLIBC_TUNABLES="glibc.malloc.trim_threshold=1") == "false"


def test_large_buffers_round_trip_with_the_tuning_on() -> None:
    # The tuning changes where memory comes from, never what it holds.
    from jaxcluster import _malloc, wire

    _malloc.keep_freed_memory()
    import numpy as np

    for size in (1 << 20, 20 << 20, 40 << 20):
        x = np.arange(size // 4, dtype=np.float32)
        encoded = wire.encode(x)
        back = wire.decode(encoded.pickle, encoded.buffers)
        np.testing.assert_array_equal(back, x)
        del back, encoded
