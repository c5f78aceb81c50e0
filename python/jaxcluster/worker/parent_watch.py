"""Draining a worker when its parent goes away: ``--stop-on-stdin-eof``.

``LocalCluster`` holds the only writing end of each worker's standard input, so end of
file there means the parent died (even by SIGKILL). :class:`ParentWatch` notices it, begins
the server's shutdown, and gives the worker a grace period to drain before exiting hard.

The watch reads the raw file descriptor with ``select``, never ``sys.stdin``: a thread
blocked inside ``sys.stdin.buffer.read`` holds that buffered reader's lock, and an
interpreter that finalizes while a thread holds it aborts with "Fatal Python error:
_enter_buffered_busy" (and a non-zero status). The watch also has a stop pipe, so the worker
stops and joins the thread before it exits.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from typing import Any

__all__ = ["ParentWatch"]

#: After standard input closes (the parent died), how long the worker may take to drain.
ORPHAN_GRACE_SECONDS = 10.0


class ParentWatch:
    """A thread that begins ``server``'s shutdown when standard input reaches end of file.

    Example::

        watch = ParentWatch(server)
        watch.start()
        ...                 # serve
        watch.stop()        # before the interpreter exits
    """

    def __init__(self, server: Any, grace_seconds: float = ORPHAN_GRACE_SECONDS) -> None:
        self._server = server
        self._grace = grace_seconds
        self._fd = sys.stdin.fileno()
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(
            target=self._watch, name="jaxcluster-parent-watch", daemon=True
        )
        self._killer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def start(self) -> None:
        """Starts watching."""
        self._thread.start()

    def _watch(self) -> None:
        while True:
            readable, _, _ = select.select([self._fd, self._wake_read], [], [])
            if self._wake_read in readable:
                return
            try:
                if os.read(self._fd, 65536):
                    continue
            except OSError:
                pass  # an unreadable stdin counts as a closed one
            break
        with self._lock:
            if self._stopped:
                return
            self._server.begin_shutdown()
            # The timer's thread only ever calls os._exit, which takes no I/O lock.
            self._killer = threading.Timer(self._grace, os._exit, args=(1,))
            self._killer.daemon = True
            self._killer.start()

    def stop(self) -> None:
        """Stops the watch (and a pending hard exit) and joins its thread. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            if self._killer is not None:
                self._killer.cancel()
        os.write(self._wake_write, b"x")
        if self._thread.ident is not None:  # started
            self._thread.join()
        if self._killer is not None:
            self._killer.join()
        os.close(self._wake_read)
        os.close(self._wake_write)
