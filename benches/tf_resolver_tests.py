"""TensorFlow 2.21's own cluster-resolver tests, run against jaxcluster with names mapped only.

A measurement, not a test suite of ours: TF's source is read from a TensorFlow checkout
given on the command line (nothing of TF's is copied into this repository), every name that
points into TensorFlow is rewritten to jaxcluster's (imports, module and class names), the
rewritten files are written to a temporary directory with a small shim for what TF's tests
import from TF's test framework, and pytest runs them. The result is printed per file, in
total, and as a table of the causes of the failures: each known failure is listed in
``KNOWN_FAILURES`` with its cause (a deliberate difference that docs/porting.md lists, or a
test of TF's own runtime or private helpers); anything else is shown as ``unexplained``.

The files (paths under ``tensorflow/python/distribute/cluster_resolver/``, TF 2.21)::

    cluster_resolver_test.py  gce_cluster_resolver_test.py  kubernetes_cluster_resolver_test.py
    sagemaker_cluster_resolver_test.py  slurm_cluster_resolver_test.py
    tfconfig_cluster_resolver_test.py  tpu/tpu_cluster_resolver_test.py

Example (materialise TF's files anywhere outside the repository first)::

    git --git-dir=TF.git archive v2.21.0 tensorflow/python/distribute/cluster_resolver \\
        | tar -x -C /tmp/tf-src
    python benches/tf_resolver_tests.py --tf-src /tmp/tf-src
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

RESOLVER_DIR = "tensorflow/python/distribute/cluster_resolver"

TEST_FILES = (
    "cluster_resolver_test.py",
    "gce_cluster_resolver_test.py",
    "kubernetes_cluster_resolver_test.py",
    "sagemaker_cluster_resolver_test.py",
    "slurm_cluster_resolver_test.py",
    "tfconfig_cluster_resolver_test.py",
    "tpu/tpu_cluster_resolver_test.py",
)

# Every import of TF's test files, and what it becomes: jaxcluster's module or class of the
# same role, or a module of the shim below (TF's test framework and TF-runtime names).
_TF_RESOLVERS = "tensorflow.python.distribute.cluster_resolver"
IMPORTS: dict[str, str] = {
    # the resolvers
    f"from {_TF_RESOLVERS} import cluster_resolver": "from jaxcluster import cluster_resolver",
    f"from {_TF_RESOLVERS}.cluster_resolver import UnionClusterResolver": (
        "from jaxcluster.cluster_resolver import UnionClusterResolver"
    ),
    f"from {_TF_RESOLVERS}.gce_cluster_resolver import GCEClusterResolver": (
        "from jaxcluster.cluster_resolver.gce import GCEClusterResolver"
    ),
    f"from {_TF_RESOLVERS}.kubernetes_cluster_resolver import ExecutableLocation": (
        "from jaxcluster.cluster_resolver.k8s import "
        "KubernetesExecutableLocation as ExecutableLocation"
    ),
    f"from {_TF_RESOLVERS}.kubernetes_cluster_resolver import KubernetesClusterResolver": (
        "from jaxcluster.cluster_resolver.k8s import KubernetesClusterResolver"
    ),
    f"from {_TF_RESOLVERS}.sagemaker_cluster_resolver import SageMakerClusterResolver": (
        "from jaxcluster.cluster_resolver.sagemaker import SageMakerClusterResolver"
    ),
    f"from {_TF_RESOLVERS}.slurm_cluster_resolver import expand_hostlist": (
        "from jaxcluster.cluster_resolver.slurm import expand_hostlist"
    ),
    f"from {_TF_RESOLVERS}.slurm_cluster_resolver import expand_tasks_per_node": (
        "from jaxcluster.cluster_resolver.slurm import expand_tasks_per_node"
    ),
    f"from {_TF_RESOLVERS}.slurm_cluster_resolver import SlurmClusterResolver": (
        "from jaxcluster.cluster_resolver.slurm import SlurmClusterResolver"
    ),
    f"from {_TF_RESOLVERS} import tfconfig_cluster_resolver": (
        "from jaxcluster.cluster_resolver import tfconfig as tfconfig_cluster_resolver"
    ),
    f"from {_TF_RESOLVERS}.tpu import tpu_cluster_resolver as resolver": (
        "from jaxcluster.cluster_resolver import tpu as resolver; "
        "from jaxcluster import devices as tpu_devices"
    ),
    # tf.train.ClusterSpec and tf.errors
    "from tensorflow.python.training import server_lib": "import jaxcluster as server_lib",
    "from tensorflow.python.framework import errors": "from jaxcluster import errors",
    # TF's test framework
    "from tensorflow.python.platform import test": "from tfshim import test",
    "from tensorflow.python.framework import test_util": "from tfshim import test_util",
    "from tensorflow.python.platform import tf_logging as logging": "import logging",
    "from tensorflow.python.util import compat": "from tfshim import compat",
    # tf.config.list_logical_devices and tf.config.LogicalDevice
    "from tensorflow.python.framework import config": "from jaxcluster import devices as config",
    "from tensorflow.python.eager import context": "from jaxcluster import devices as context",
    # TF's graph-mode runtime (tf.compat.v1.Session), which jaxcluster does not have
    "from tensorflow.python.client import session": "from tfshim import session",
    "from tensorflow.core.protobuf.tpu import topology_pb2": "from tfshim import topology_pb2",
    # TF's Cloud TPU client (a TF-internal module; cloud_tpu_client is its pip twin)
    "from tensorflow.python.tpu.client import client": "from tfshim import tpu_client as client",
    "from cloud_tpu_client import client": "from tfshim import tpu_client as client",
    # six, for Python 2
    "import six": "import urllib.request",
    "from six.moves.urllib.error import URLError": "from urllib.error import URLError",
}

# Other names (regular expressions), replaced after the imports: TF's private TPU helper
# that has a public jaxcluster twin, and six's module path.
NAMES: dict[str, str] = {
    r"resolver\.TPUClusterResolver\s*\._verify_and_return_same_core_count": (
        "tpu_devices.verify_same_core_count"
    ),
    r"six\.moves\.urllib\.request": "urllib.request",
}

# The shim: TF's test framework as TF's resolver tests use it, and stand-ins for the TF
# runtime names they import (so a file imports; tests that need TF's runtime then fail).
SHIM: dict[str, str] = {
    "__init__.py": "",
    "test.py": '''
        """tensorflow.python.platform.test, as TF's resolver tests use it."""
        import re
        import unittest
        from unittest import mock

        main = unittest.main


        def _cluster_def_jobs(cluster_def):
            """{job: {task: address}} and the job order of a ClusterDef (ours or TF's)."""
            jobs = cluster_def.job if hasattr(cluster_def, "job") else cluster_def["job"]
            out = {}
            for job in jobs:
                name = job.name if hasattr(job, "name") else job["name"]
                tasks = job.tasks if hasattr(job, "tasks") else job["tasks"]
                out[name] = {int(k): str(v) for k, v in dict(tasks).items()}
            return out


        _TOKEN = re.compile(r"""\\s*(?:([A-Za-z_]\\w*)|'([^']*)'|"([^"]*)"|(-?\\d+)|([{}:,]))""")


        def parse_cluster_def(text):
            """A ClusterDef in protobuf text format: {job: {task: address}}, in order."""
            tokens, pos = [], 0
            text = text.strip()
            while pos < len(text):
                m = _TOKEN.match(text, pos)
                if m is None:
                    raise ValueError(f"cannot parse {text[pos:pos + 20]!r}")
                pos = m.end()
                ident, sq, dq, num, punct = m.groups()
                if ident is not None:
                    tokens.append(("id", ident))
                elif sq is not None or dq is not None:
                    tokens.append(("str", sq if sq is not None else dq))
                elif num is not None:
                    tokens.append(("num", int(num)))
                elif punct != ",":
                    tokens.append(("p", punct))

            def message(i):
                fields = []
                while i < len(tokens) and tokens[i] != ("p", "}"):
                    name = tokens[i][1]
                    i += 1
                    if tokens[i] == ("p", ":"):
                        i += 1
                    if tokens[i] == ("p", "{"):
                        value, i = message(i + 1)
                        i += 1
                    else:
                        value = tokens[i][1]
                        i += 1
                    fields.append((name, value))
                return fields, i

            fields, _ = message(0)
            jobs = {}
            for field, job in fields:
                assert field == "job", field
                name = dict(job).get("name", "")
                tasks = {}
                for key, task in job:
                    if key == "tasks":
                        entry = dict(task)
                        tasks[int(entry.get("key", 0))] = entry.get("value", "")
                jobs[name] = tasks
            return jobs


        class TestCase(unittest.TestCase):
            """TF's test.TestCase: the assert methods its resolver tests call."""

            def assertProtoEquals(self, expected, message):
                want = parse_cluster_def(expected) if isinstance(expected, str) else expected
                got = _cluster_def_jobs(message)
                self.assertEqual(list(want), list(got))
                self.assertEqual(want, got)

            assertRaisesRegexp = unittest.TestCase.assertRaisesRegex
        ''',
    "test_util.py": '''
        """tensorflow.python.framework.test_util: graph mode does not exist here."""


        def run_all_in_graph_and_eager_modes(cls):
            return cls
        ''',
    "compat.py": '''
        """tensorflow.python.util.compat.as_bytes."""


        def as_bytes(value, encoding="utf-8"):
            return value if isinstance(value, bytes) else value.encode(encoding)
        ''',
    "session.py": '''
        """TF's runtime: tf.compat.v1.Session's device listing."""
        import collections

        _DeviceAttributes = collections.namedtuple(
            "_DeviceAttributes", ["name", "device_type", "memory_limit_bytes", "incarnation"]
        )


        class BaseSession:
            def list_devices(self):
                raise NotImplementedError("TF's runtime is not here")
        ''',
    "tpu_client.py": '''
        """TF's Cloud TPU client (tensorflow.python.tpu.client.client): jaxcluster has none;
        the name exists so the file imports."""
        ''',
    "topology_pb2.py": '''
        """TF's TopologyProto, serialized by hand (protobuf wire format), and the hardware
        feature type jaxcluster reads it into."""
        from jaxcluster.cluster_resolver.tpu import TPUHardwareFeature


        def _varint(n):
            out = bytearray()
            n &= (1 << 64) - 1
            while True:
                byte, n = n & 0x7F, n >> 7
                out.append(byte | (0x80 if n else 0))
                if not n:
                    return bytes(out)


        class TopologyProto:
            def __init__(self, mesh_shape=(), num_tasks=0, num_tpu_devices_per_task=0,
                         device_coordinates=()):
                self.fields = [(1, mesh_shape), (2, num_tasks), (3, num_tpu_devices_per_task),
                               (4, device_coordinates)]

            def SerializeToString(self):
                out = bytearray()
                for number, value in self.fields:
                    if isinstance(value, int):
                        if value:
                            out += _varint(number << 3) + _varint(value)
                    elif value:
                        packed = b"".join(_varint(v) for v in value)
                        out += _varint(number << 3 | 2) + _varint(len(packed)) + packed
                return bytes(out)
        ''',
}

# Failures with a known cause, by pytest node id (file::class::test).
DELIBERATE = "deliberate (docs/porting.md)"
TF_RUNTIME = "TF's runtime (a TPU worker's devices listed through a TF Session)"
TF_PRIVATE = "TF-internal (TF's private helpers or mock targets)"
_BASE = "cluster_resolver_test.py::BaseClusterResolverTest::"
_K8S = "kubernetes_cluster_resolver_test.py::KubernetesClusterResolverTest::"
_SLURM = "slurm_cluster_resolver_test.py::SlurmClusterResolverTest::"
_TFCONFIG = "tfconfig_cluster_resolver_test.py::TFConfigClusterResolverTest::"
_TPU = "tpu/tpu_cluster_resolver_test.py::TPUClusterResolverTest::"
_COUNT_TF_DEVICES = (
    TF_RUNTIME,
    "the TPU resolver's num_accelerators() with TF's Session mocked; jaxcluster asks the "
    "TPU worker over gRPC (or the device_lister given)",
)
_POD_IP = (
    DELIBERATE,
    "Kubernetes: the pod IP by default (TF's mock pods have only status.host_ip; "
    "use_host_ip=True is TF's choice)",
)
_EMPTY_CUDA = (DELIBERATE, "Slurm: CUDA_VISIBLE_DEVICES='' means zero GPUs, not TF's split")
_TPU_CLIENT = (
    TF_PRIVATE,
    "patches TF's Cloud TPU client (client._request_compute_metadata); jaxcluster asks "
    "the metadata server itself",
)
_HALF_COORDINATOR = (
    DELIBERATE,
    "TPU: coordinator_name without coordinator_address is an error (TF starts a server); "
    "also patches TF's Cloud TPU client",
)
_API_AVAILABLE = (
    TF_PRIVATE,
    "reads TF's private _cloud_tpu_client.api_available() (jaxcluster: a name calls the "
    "Cloud TPU API, a grpc:// address does not)",
)
_DEVICE_DICT = (
    TF_PRIVATE,
    "TF's private _get_device_dict_and_cores (its twin jaxcluster.devices.tpu_device_map "
    "takes names and gives integer ids)",
)
KNOWN_FAILURES: dict[str, tuple[str, str]] = {
    _TPU + "testNumAcceleratorsSuccess": _COUNT_TF_DEVICES,
    _K8S + "testSingleItemSuccessfulRetrievalInCluster": _POD_IP,
    _K8S + "testSingleItemSuccessfulRetrieval": _POD_IP,
    _K8S + "testSuccessfulRetrievalWithSort": _POD_IP,
    _K8S + "testGetMasterWithOverrideParameters": _POD_IP,
    _K8S + "testMultiplePodSelectorsAndWorkers": _POD_IP,
    _SLURM + "testMultiTaskPerNodeRetrieval": _EMPTY_CUDA,
    _SLURM + "testMultipleGpusPerTaskRetrieval": _EMPTY_CUDA,
    _TPU + "testRetrieveProjectAndZoneFromMetadata": _HALF_COORDINATOR,
    _TPU + "testPodResolution": _HALF_COORDINATOR,
    _TPU + "testRetrieveProjectAndZoneFromMetadataNoCoordinator": _TPU_CLIENT,
    _TPU + "testNotReadyCloudTpu": _TPU_CLIENT,
    _TPU + "testShouldResolveGrpc": _API_AVAILABLE,
    _TPU + "testShouldResolveName": _API_AVAILABLE,
    _TPU + "testShouldResolveList": _API_AVAILABLE,
    _TPU + "testShouldResolveGrpcPrefix": _API_AVAILABLE,
    _TPU + "testGetDeviceDictAndCoresWithTPUs": _DEVICE_DICT,
    _TPU + "testGetDeviceDictAndCoresWithCPUsAndGPUs": _DEVICE_DICT,
    _TPU + "testIsRunningInGce": (
        TF_PRIVATE,
        "patches urllib's urlopen; jaxcluster opens the metadata server through its own "
        "opener that bypasses proxies",
    ),
}


def rewrite(source: str, name: str) -> str:
    """TF's test file with every TensorFlow name mapped to jaxcluster's or the shim's."""
    lines = []
    for line in source.splitlines():
        stripped = line.split("#", 1)[0].strip()
        if stripped in IMPORTS:
            indent = line[: len(line) - len(line.lstrip())]
            line = indent + IMPORTS[stripped]
        elif re.match(r"(from|import)\s+(tensorflow|six|cloud_tpu_client)\b", stripped):
            raise SystemExit(f"{name}: no mapping for {stripped!r}; add it to IMPORTS")
        lines.append(line)
    text = "\n".join(lines) + "\n"
    for old, new in NAMES.items():
        text = re.sub(old, new, text)
    return text


def write_tree(tf_src: Path, out: Path, files: tuple[str, ...] = TEST_FILES) -> dict[str, Path]:
    """The rewritten test ``files`` and the shim under ``out``: TF's name -> rewritten file."""
    shim = out / "tfshim"
    shim.mkdir(parents=True, exist_ok=True)
    for filename, body in SHIM.items():
        (shim / filename).write_text(textwrap.dedent(body).lstrip())
    written = {}
    for rel in files:
        source = tf_src / RESOLVER_DIR / rel
        if not source.is_file():
            raise SystemExit(f"{source} is missing: --tf-src must be a TensorFlow 2.21 checkout")
        target = out / ("tf_" + rel.replace("/", "_"))
        target.write_text(rewrite(source.read_text(), rel))
        written[rel] = target
    return written


def run_file(rel: str, path: Path, out: Path) -> list[tuple[str, str, str]]:
    """``(test id, outcome, first line of the failure)`` for each test of one file, run by
    pytest in its own process (TF's tests set environment variables and leave them)."""
    report = out / (path.stem + ".xml")
    path_entries = [str(out), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path_entries), PYTHONDONTWRITEBYTECODE="1")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--rootdir={out}",
            f"--junitxml={report}",
            str(path),
        ],
        cwd=out,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    results = []
    for case in ET.parse(report).iter("testcase"):
        test_id = f"{rel}::{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None:
            results.append((test_id, "skipped", ""))
        elif problem is None:
            results.append((test_id, "passed", ""))
        else:
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            results.append((test_id, "failed", message[0][:160] if message else ""))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tf-src", type=Path, required=True, help="a TensorFlow 2.21 checkout")
    parser.add_argument("--keep", type=Path, help="write the rewritten files here and keep them")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every failure")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tf-resolver-tests-") as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        files = write_tree(args.tf_src, out)
        results = [r for rel, path in files.items() for r in run_file(rel, path, out)]

    per_file: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    causes: dict[str, list[str]] = collections.defaultdict(list)
    for test_id, outcome, message in results:
        per_file[test_id.split("::")[0]][outcome] += 1
        if outcome == "failed":
            kind, why = KNOWN_FAILURES.get(test_id, ("unexplained", message))
            causes[f"{kind}: {why}"].append(test_id)

    stale = sorted(set(KNOWN_FAILURES) & {t for t, outcome, _ in results if outcome == "passed"})
    print(f"{'file':<48} {'passed':>6} {'failed':>6}")
    for name, counts in per_file.items():
        print(f"{name:<48} {counts['passed']:>6} {counts['failed']:>6}")
    passed = sum(c["passed"] for c in per_file.values())
    print(f"{'total':<48} {passed:>6} {len(results) - passed:>6}   ({passed} of {len(results)})")
    if causes:
        print("\nfailures by cause:")
        for cause, tests in sorted(causes.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            print(f"{len(tests):>4}  {cause}")
            if args.verbose or cause.startswith("unexplained"):
                for test_id in tests:
                    print(f"        {test_id}")
    for test_id in stale:
        print(f"passes now, listed in KNOWN_FAILURES: {test_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
