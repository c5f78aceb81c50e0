"""Writes the "Every file" table of docs/ARCHITECTURE.md from the tree: each Rust and Python
source file of the package with the first sentence of its own module doc.

    python tests/support/file_table.py        # rewrite the section in place

``tests/test_architecture_doc.py`` fails while the table and the tree disagree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
ROOMS = ("rust", "python/jaxcluster")
HEADING = "## Every file"
INTRO = (
    "Every source file, by room (`tests/test_architecture_doc.py` fails when a file is added,\n"
    "moved or removed without this table following; `python tests/support/file_table.py`\n"
    "rewrites it); each line is the file's own module doc, shortened.\n"
)


def source_files() -> list[Path]:
    """The package's Rust and Python sources, test folders left out (listed by their parent)."""
    files = []
    for room in ROOMS:
        for path in sorted((ROOT / room).rglob("*")):
            relative = path.relative_to(ROOT).as_posix()
            wanted = path.suffix in (".rs", ".py") and "__pycache__" not in relative
            if wanted and "/tests/" not in relative:
                files.append(path)
    return sorted(files, key=lambda path: (path.parent.as_posix(), path.name))


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    guarded = text.replace("e.g.", "e\0g\0").replace("i.e.", "i\0e\0")
    parts = re.split(r"(?<=[.:])\s+", guarded)
    sentence = parts[0]
    if len(sentence) < 40 and len(parts) > 1:  # "[`Dispatcher`]: the public face ..."
        sentence = sentence.rstrip(".:") + ": " + parts[1]
    sentence = sentence.replace("e\0g\0", "e.g.").replace("i\0e\0", "i.e.").rstrip(":.")
    if len(sentence) > 160:
        sentence = sentence[:157].rsplit(" ", 1)[0] + " …"
    return sentence.replace("|", "\\|")


def module_doc(path: Path) -> str:
    """The first sentence of a file's module doc (``//!`` lines, or the docstring)."""
    text = path.read_text()
    if path.suffix == ".py":
        doc = ast.get_docstring(ast.parse(text)) or ""
        return _first_sentence(doc.split("\n\n")[0])
    lines = []
    for line in text.splitlines():
        if line.startswith("//!"):
            lines.append(line[3:].strip())
        elif lines or not (line.strip() == "" or line.startswith("#![")):
            break
    paragraph = []
    for line in lines:
        if not line and paragraph:
            break
        paragraph.append(line)
    return _first_sentence(" ".join(paragraph)) or "tests"


def table() -> str:
    out: list[str] = []
    folder = None
    for path in source_files():
        relative = path.relative_to(ROOT)
        parent = relative.parent.as_posix()
        if parent != folder:
            folder = parent
            out.append(f"\n**`{folder}/`**\n\n| file | holds |\n|---|---|")
        out.append(f"| `{path.name}` | {module_doc(path)} |")
    return "\n".join(out) + "\n"


def main() -> None:
    text = DOC.read_text()
    head = text[: text.index(HEADING)] if HEADING in text else text.rstrip("\n") + "\n\n"
    DOC.write_text(f"{head}{HEADING}\n\n{INTRO}{table()}")


if __name__ == "__main__":
    main()
