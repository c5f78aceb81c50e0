"""Parameter-server training: :class:`ParameterServerStrategy`, its variables, partitioners,
checkpoints and the ps-failure rules the coordinator applies.

Example::

    from jaxcluster.strategy import ParameterServerStrategy, FixedShardsPartitioner

    strategy = ParameterServerStrategy(resolver, variable_partitioner=FixedShardsPartitioner(2))
    with strategy.scope():
        embeddings = strategy.Variable(np.zeros((1000, 16), np.float32), name="embeddings")
    strategy.save("/ckpt/model.jaxc")
"""

from __future__ import annotations

from jaxcluster._ps_failures import TransientPSFailures as TransientPSFailures
from jaxcluster._ps_failures import failed_ps_task as failed_ps_task
from jaxcluster._ps_failures import is_ps_failure as is_ps_failure
from jaxcluster.strategy.parameter_server_strategy import (
    ParameterServerStrategy as ParameterServerStrategy,
)
from jaxcluster.strategy.partitioners import FixedShardsPartitioner as FixedShardsPartitioner
from jaxcluster.strategy.partitioners import MaxSizePartitioner as MaxSizePartitioner
from jaxcluster.strategy.partitioners import MinSizePartitioner as MinSizePartitioner
from jaxcluster.strategy.variables import ParameterServerVariable as ParameterServerVariable

__all__ = [
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "ParameterServerStrategy",
    "ParameterServerVariable",
    "TransientPSFailures",
    "failed_ps_task",
    "is_ps_failure",
]
