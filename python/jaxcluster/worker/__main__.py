"""``python -m jaxcluster.worker``."""

from __future__ import annotations

import sys

from jaxcluster.worker.main import main

if __name__ == "__main__":
    sys.exit(main())
