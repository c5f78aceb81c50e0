"""``benches/tf_resolver_tests.py``, the run of TF's own resolver tests with names mapped, on a
small file written in TF's style (TF's sources are not here): imports are mapped, an unmapped
TF import stops the run, the shim's ``assertProtoEquals`` reads TF's text format, and pytest's
outcomes come back per test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benches" / "tf_resolver_tests.py"

TF_STYLE = '''
from tensorflow.python.distribute.cluster_resolver import cluster_resolver
from tensorflow.python.platform import test
from tensorflow.python.training import server_lib

mock = test.mock


class SpecTest(test.TestCase):

  def testSparseJobs(self):
    spec = server_lib.ClusterSpec({"ps": ["ps0:2222"], "worker": {3: "w3:2222"}})
    resolver = cluster_resolver.SimpleClusterResolver(spec)
    self.assertProtoEquals("""
    job { name: 'ps' tasks { value: 'ps0:2222' } }
    job { name: 'worker', tasks { key: 3 value: "w3:2222" } }
    """, resolver.cluster_spec().as_cluster_def())

  def testWrongKey(self):
    spec = server_lib.ClusterSpec({"ps": ["ps0:2222"]})
    self.assertProtoEquals(
        "job { name: 'ps' tasks { key: 1 value: 'ps0:2222' } }", spec.as_cluster_def())

  def testRegexpAlias(self):
    with self.assertRaisesRegexp(ValueError, "bad"):
      raise ValueError("bad")
'''


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tf_resolver_tests", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_imports_are_mapped_and_an_unmapped_one_stops_the_run(bench: ModuleType) -> None:
    text = bench.rewrite(TF_STYLE, "x_test.py")
    assert "tensorflow" not in text
    assert "import jaxcluster as server_lib" in text
    assert "from jaxcluster import cluster_resolver" in text
    with pytest.raises(SystemExit, match=r"no mapping for 'from tensorflow\.python\.ops import"):
        bench.rewrite("from tensorflow.python.ops import math_ops  # lint\n", "x_test.py")


def test_a_tf_style_file_runs_with_outcomes_per_test(bench: ModuleType, tmp_path: Path) -> None:
    source = tmp_path / "tf" / bench.RESOLVER_DIR / "x_test.py"
    source.parent.mkdir(parents=True)
    source.write_text(TF_STYLE)
    out = tmp_path / "out"
    files = bench.write_tree(tmp_path / "tf", out, files=("x_test.py",))
    results = {
        test_id: outcome
        for test_id, outcome, _ in bench.run_file("x_test.py", files["x_test.py"], out)
    }
    assert results == {
        "x_test.py::SpecTest::testSparseJobs": "passed",
        "x_test.py::SpecTest::testWrongKey": "failed",
        "x_test.py::SpecTest::testRegexpAlias": "passed",
    }
