"""The shared bearer token: one environment variable for workers, ps tasks and coordinators.

Example::

    token = auth_token_from_env()   # JAXCLUSTER_AUTH_TOKEN, stripped, or None when unset
"""

from __future__ import annotations

import os

__all__ = ["AUTH_TOKEN_ENV", "auth_token_from_env"]

#: Every RPC must carry ``authorization: Bearer <token>``; this variable holds the token.
AUTH_TOKEN_ENV = "JAXCLUSTER_AUTH_TOKEN"


def auth_token_from_env() -> str | None:
    """``JAXCLUSTER_AUTH_TOKEN`` without surrounding whitespace, or ``None`` when unset/empty."""
    return os.environ.get(AUTH_TOKEN_ENV, "").strip() or None
