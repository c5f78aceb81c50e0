"""Docstring examples written as doctests (``>>>``) run, and print what they say.

Every module of the package whose source holds a ``>>>`` example is imported and its
doctests run (the public API's examples that need no cluster are written this way; those
that need one are plain ``Example::`` blocks; the README's longer examples run in
tests/test_readme.py, the docs pages' in tests/test_docs_examples.py). A new ``>>>`` example
is picked up without editing this file.
"""

from __future__ import annotations

import doctest
import importlib
import os
from pathlib import Path

import pytest

import jaxcluster

PACKAGE = Path(jaxcluster.__file__).resolve().parent


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py" or ">>>" not in path.read_text():
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


def test_the_examples_are_found() -> None:
    # The discovery itself: these modules' public classes carry doctests.
    for name in (
        "jaxcluster.cluster_spec",
        "jaxcluster.device_spec",
        "jaxcluster.strategy.partitioners",
    ):
        assert name in MODULES, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
    assert tests, f"{name} holds '>>>' but doctest found no example in it"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    # An example may set variables as a user would (TFConfigClusterResolver's sets
    # TF_CONFIG): the tests after this one must not see them.
    environment = dict(os.environ)
    try:
        for test in tests:
            runner.run(test, out=report.append)
    finally:
        os.environ.clear()
        os.environ.update(environment)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)
