"""How a task process ends once its server stopped (``_task_process.end_process``): its
``atexit`` handlers run and every buffered line is written, and the exit status is kept,
though the interpreter is not finalized under the runtime's live threads."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_end_process_runs_atexit_flushes_and_keeps_the_status() -> None:
    program = textwrap.dedent(
        """
        import atexit, logging, sys, threading, time
        from jaxcluster._task_process import end_process

        atexit.register(lambda: print("atexit ran", flush=True))
        logging.basicConfig(stream=sys.stderr, format="%(message)s")
        logging.getLogger("jaxcluster.test").warning("logged before the end")
        # A daemon thread still busy, as the runtime's are: not waited for.
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
        sys.stdout.write("buffered, never flushed by hand")
        end_process(7)
        print("not reached")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout.startswith("buffered, never flushed by hand"), done.stdout
    assert "atexit ran" in done.stdout
    assert "not reached" not in done.stdout
    assert "logged before the end" in done.stderr
