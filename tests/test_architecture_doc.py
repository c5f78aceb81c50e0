"""docs/ARCHITECTURE.md's file table matches the tree: every Rust and Python source file of
the package is listed in its folder's table, and every file listed exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
ROOMS = ("rust", "python/jaxcluster")


def _tree() -> set[str]:
    files = set()
    for room in ROOMS:
        for path in (ROOT / room).rglob("*"):
            relative = path.relative_to(ROOT).as_posix()
            if path.suffix not in (".rs", ".py") or "__pycache__" in relative:
                continue
            if "/tests/" in relative:  # test folders are listed by their mod.rs, not per file
                continue
            files.add(relative)
    return files


def _listed() -> set[str]:
    text = DOC.read_text()
    section = text[text.index("## Every file") :]
    listed = set()
    folders: set[str] = set()
    folder = None
    for line in section.splitlines():
        heading = re.fullmatch(r"\*\*`([^`]+)/`\*\*", line.strip())
        if heading:
            folder = heading.group(1)
            assert folder not in folders, f"{folder}/ has two tables in 'Every file'"
            folders.add(folder)
            continue
        row = re.match(r"\| `([^`]+)` \|", line)
        if row and folder is not None:
            listed.add(f"{folder}/{row.group(1)}")
    return listed


def test_every_source_file_is_in_the_architecture_table() -> None:
    tree, listed = _tree(), _listed()
    fix = "run `python tests/support/file_table.py` to rewrite docs/ARCHITECTURE.md's table"
    assert tree - listed == set(), f"not in 'Every file': {fix}"
    assert listed - tree == set(), f"listed in 'Every file' but gone: {fix}"
