"""Smoke test of an installed jaxcluster wheel: the README's first example, from a directory
without the source tree. ``--no-cluster`` stops after the import checks."""

import os
import sys
import tempfile

os.chdir(tempfile.mkdtemp())  # never import the checkout's python/ by accident

import jaxcluster  # noqa: E402
from jaxcluster import ClusterSpec  # noqa: E402

assert "site-packages" in jaxcluster.__file__, jaxcluster.__file__
assert ClusterSpec({"worker": ["a:1"]}).as_dict() == {"worker": ["a:1"]}
print("jaxcluster", jaxcluster.__version__, "from", os.path.dirname(jaxcluster.__file__))

if "--no-cluster" not in sys.argv:
    from jaxcluster import LocalCluster

    with LocalCluster(num_workers=2) as cluster, cluster.coordinator() as coordinator:
        values = [coordinator.schedule(lambda x: x * x, args=(i,)) for i in range(8)]
        coordinator.join()
        assert coordinator.fetch(values) == [i * i for i in range(8)]
    print("README example: ok")
