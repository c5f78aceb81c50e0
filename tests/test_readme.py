"""The README's runnable Python blocks (fenced exactly ```python) run and their asserts hold.

Blocks fenced ```python no-run need a real cluster (Slurm, Kubernetes, a cloud project); they
are compiled and their import lines run, so a renamed API breaks this test rather than a
reader. The README is a landing page: the longer examples it links to live on the docs
pages, whose blocks tests/test_docs_examples.py runs (the Observability block among them).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(python(?: no-run)?)\n(.*?)^```$", re.S | re.M)


def _blocks(kind: str) -> list[str]:
    return [body for info, body in FENCE.findall(README.read_text()) if info == kind]


def test_readme_has_runnable_examples() -> None:
    # A quickstart, the coordinator, multi-device hosts, parameter servers, resolvers: at
    # least three run; a coordinator and resolvers on a real cluster are shown.
    assert len(_blocks("python")) >= 3
    assert len(_blocks("python no-run")) >= 2


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_readme_block_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"block_{index}.py"
    script.write_text(_blocks("python")[index])
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"README block {index} failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("index", range(len(_blocks("python no-run"))))
def test_readme_no_run_block_compiles_and_imports(index: int) -> None:
    block = _blocks("python no-run")[index]
    compile(block, f"README no-run block {index}", "exec")
    imports = [line for line in block.splitlines() if line.startswith(("import ", "from "))]
    assert imports, f"README no-run block {index} imports nothing from jaxcluster"
    exec("\n".join(imports), {})
