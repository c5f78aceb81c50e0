"""TF's ``service=``: a googleapiclient discovery client, or anything shaped like one.

TF's GCE and TPU resolvers take a discovery client (``googleapiclient.discovery.build(...)``)
and call its collections, ``.execute()``-ing each request. A program (or TF's own tests)
that passes one keeps working: the resolvers make the same calls on it, duck-typed, so
googleapiclient is never imported here. The other accepted ``service=``, a
``requests.Session``, goes through the REST client in ``_google.py``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["execute", "is_discovery_client"]


def is_discovery_client(service: object, *collections: str) -> bool:
    """Whether ``service`` has every one of ``collections`` as a callable, as a discovery
    client of the API does (``instanceGroups`` and ``instances`` for Compute Engine)."""
    return service is not None and all(callable(getattr(service, c, None)) for c in collections)


def execute(request: Any, what: str) -> dict[str, Any]:
    """The decoded answer of a discovery request; the client's own errors (``HttpError``)
    propagate as they are. ``TypeError`` naming ``what`` when it is not a JSON object."""
    response = request.execute()
    if not isinstance(response, dict):
        raise TypeError(
            f"the service= client answered {what} with {type(response).__name__} "
            f"{response!r}; expected a dict (the API's JSON object), as a googleapiclient "
            "discovery client's request.execute() returns"
        )
    return response
