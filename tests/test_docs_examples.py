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


def _blocks_using(text: str) -> list[tuple[str, str]]:
    return [(name, body) for name, body in BLOCKS if text in body]


def test_a_block_needing_an_extra_says_how_to_install_it() -> None:
    blocks = _blocks_using("prometheus_client")
    assert blocks
    for name, body in blocks:
        assert "pip install 'jaxcluster[metrics]'" in body, name


@pytest.mark.parametrize(
    ("name", "body"),
    _blocks_using('logging.getLogger("jaxcluster").setLevel'),
    ids=[name for name, _ in _blocks_using('logging.getLogger("jaxcluster").setLevel')],
)
def test_a_block_that_sets_a_log_level_also_prints_the_records(
    name: str, body: str, tmp_path: Path
) -> None:
    # The library adds only a NullHandler: a level alone prints nothing, so the block must
    # give the records a handler too. A WARNING from the dispatcher (as on a lost worker)
    # logged after the block has run must reach stderr.
    script = tmp_path / "block.py"
    probe = "lost worker 127.0.0.1:1 (probe from test_docs_examples)"
    script.write_text(f'{body}\nlogging.getLogger("jaxcluster.dispatch").warning({probe!r})\n')
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stderr}"
    assert f"WARNING jaxcluster.dispatch: {probe}" in done.stderr, name


def test_the_observability_page_shows_logging_with_a_handler() -> None:
    # The block users copy first (it once printed nothing: a level without a handler).
    assert any(
        name.startswith("observability.md")
        for name, _ in _blocks_using('logging.getLogger("jaxcluster").setLevel')
    )
