"""tests/real: the resolvers, jaxcluster.initialize() and the Slurm recipe on a real Slurm
22.05 cluster (four slurmd daemons on this machine) and a real Open MPI.

Start the cluster with `bash tests/real/slurm/up.sh` (root); without one each module here is
one skip saying why (each calls find_cluster() while it is imported). CI sets
JAXCLUSTER_REQUIRE_REAL_CLUSTERS, which turns the skip into a collection error.
"""

from __future__ import annotations

import pytest

from support.slurm import SlurmCluster, find_cluster


@pytest.fixture(scope="session")
def slurm() -> SlurmCluster:
    return find_cluster()
