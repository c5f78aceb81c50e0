"""Optional dependencies: without the Kubernetes or Google clients, everything else works and
the resolvers that need them raise MissingExtraError naming the ``pip install`` line.

The clients are made unimportable in a subprocess (``sys.modules[name] = None`` makes
``import name`` raise ``ImportError``, as a missing package does); the wheel-install test
checks the same in a virtualenv where they are really absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = ("kubernetes", "google", "google.auth", "requests", "urllib3")


def _run(body: str) -> subprocess.CompletedProcess[str]:
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in BLOCKED)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_resolvers_needing_an_extra_name_the_pip_line() -> None:
    done = _run(
        """
        from jaxcluster.cluster_resolver import (
            GCEClusterResolver, KubernetesClusterResolver, TPUClusterResolver)
        from jaxcluster.errors import JaxClusterError, MissingExtraError

        cases = {
            "k8s": lambda: KubernetesClusterResolver(),
            "gcp": lambda: GCEClusterResolver("proj", "zone", "group", 8470),
        }
        cases["gcp tpu"] = lambda: TPUClusterResolver("my-tpu", project="p", zone="z")
        for extra, make in cases.items():
            try:
                make()
            except MissingExtraError as exc:
                assert isinstance(exc, ImportError) and isinstance(exc, JaxClusterError)
                wanted = extra.split()[0]
                assert exc.extra == wanted, exc.extra
                assert exc.install == f"pip install 'jaxcluster[{wanted}]'"
                assert exc.install in str(exc), str(exc)
                print(extra, "->", exc)
            else:
                raise AssertionError(f"{extra}: no MissingExtraError")
        """
    )
    assert done.returncode == 0, done.stderr
    assert "KubernetesClusterResolver needs the official Kubernetes client" in done.stdout


def test_everything_else_works_without_the_extras() -> None:
    done = _run(
        """
        import json, os
        import jaxcluster
        from jaxcluster import ClusterSpec
        from jaxcluster.cluster_resolver import (
            SimpleClusterResolver, TFConfigClusterResolver, TPUClusterResolver, explain, resolve)
        from jaxcluster.cluster_resolver.tpu import is_running_in_gce

        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})
        assert resolve().jax_distributed_args()["process_id"] == 1
        assert "tf_config" in str(explain())
        assert TPUClusterResolver("grpc://10.0.0.1:8470").master() == "grpc://10.0.0.1:8470"
        os.environ["GCE_METADATA_HOST"] = "127.0.0.1:9"
        assert is_running_in_gce(timeout=1) is False  # stdlib only
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
