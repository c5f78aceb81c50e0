"""The README's runnable Python blocks (fenced exactly ```python) run and their asserts hold.

Blocks fenced ```python no-run need a real cluster (Slurm, Kubernetes, a cloud project); they
are compiled and their import lines run, so a renamed API breaks this test rather than a
reader.
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
    assert len(_blocks("python")) >= 3
    assert len(_blocks("python no-run")) >= 6


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


def _blocks_using(text: str) -> list[str]:
    return [block for block in _blocks("python") if text in block]


def test_a_block_needing_an_extra_says_how_to_install_it() -> None:
    blocks = _blocks_using("prometheus_client")
    assert blocks
    for block in blocks:
        assert "pip install 'jaxcluster[metrics]'" in block


def test_a_block_that_sets_a_log_level_also_prints_the_records(tmp_path: Path) -> None:
    # The library adds only a NullHandler: a level alone prints nothing, so the block must
    # give the records a handler too. A WARNING from the dispatcher (as on a lost worker)
    # logged after the block has run must reach stderr.
    blocks = _blocks_using('logging.getLogger("jaxcluster").setLevel')
    assert blocks
    for block in blocks:
        script = tmp_path / "block.py"
        probe = "lost worker 127.0.0.1:1 (probe from test_readme)"
        script.write_text(f'{block}\nlogging.getLogger("jaxcluster.dispatch").warning({probe!r})\n')
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, done.stderr
        assert f"WARNING jaxcluster.dispatch: {probe}" in done.stderr
