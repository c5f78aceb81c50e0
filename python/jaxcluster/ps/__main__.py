"""``python -m jaxcluster.ps``."""

from __future__ import annotations

import sys

from jaxcluster.ps.main import main

if __name__ == "__main__":
    sys.exit(main())
