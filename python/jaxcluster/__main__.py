"""``python -m jaxcluster``: the same command line as the ``jaxcluster`` script."""

from __future__ import annotations

from jaxcluster.cli import main

raise SystemExit(main())
