"""The documentation site's Python blocks (docs/*.md, fenced ```python) stay true.

A block that makes its own ``LocalCluster`` is self-contained: it runs, in a fresh
interpreter, and its asserts hold. The others need a real cluster (Slurm, Kubernetes, a
cloud project) or are TensorFlow shown for comparison: they are compiled, and their
jaxcluster import lines run, so a renamed API breaks this test rather than a reader.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    return [
        (f"{page.name}:{number}", body)
        for page in sorted(DOCS.glob("*.md"))
        for number, body in enumerate(FENCE.findall(page.read_text()))
    ]


BLOCKS = _blocks()
RUNNABLE = [(name, body) for name, body in BLOCKS if "LocalCluster(" in body]
SHOWN = [(name, body) for name, body in BLOCKS if "LocalCluster(" not in body]


def test_the_docs_have_examples() -> None:
    assert len(RUNNABLE) >= 3, [name for name, _ in RUNNABLE]
    assert len(SHOWN) >= 8, [name for name, _ in SHOWN]


@pytest.mark.parametrize(("name", "body"), RUNNABLE, ids=[name for name, _ in RUNNABLE])
def test_self_contained_block_runs(name: str, body: str, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(body)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize(("name", "body"), SHOWN, ids=[name for name, _ in SHOWN])
def test_other_block_compiles_and_imports(name: str, body: str) -> None:
    compile(body, name, "exec")
    imports = [
        line
        for line in body.splitlines()
        if line.startswith(("import ", "from ")) and "jaxcluster" in line
    ]
    uses = re.search(
        r"\b(ClusterCoordinator|\w+ClusterResolver|\w+Strategy|\w+Partitioner)\b", body
    )
    if uses and "tensorflow" not in body:
        assert imports, f"{name} uses {uses.group(1)} but imports nothing from jaxcluster"
    exec("\n".join(imports), {})
