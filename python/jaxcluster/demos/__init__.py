"""The demos behind ``jaxcluster demo``: each trains the same small MLP on a fresh
``LocalCluster`` while a process of the cluster is SIGKILLed midway, and reports whether the
loss went down.

- :mod:`jaxcluster.demos.cluster` (``jaxcluster demo``): asynchronous training on workers;
  a worker is lost and restarted.
- :mod:`jaxcluster.demos.ps` (``jaxcluster demo --ps``): variables on ps tasks; a ps task is
  lost and training resumes from a checkpoint.
- :mod:`jaxcluster.demos.slices` (``jaxcluster demo --slices``): SPMD steps over multi-host
  slices; a host is lost and its slice re-forms.

Example::

    from jaxcluster.demos.cluster import run_demo

    result = run_demo(steps=300)
    result.final_loss < result.initial_loss   # True
"""

__all__: list[str] = []
