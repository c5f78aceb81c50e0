"""The ``jaxcluster ps`` process: a parameter server holding named variables.

The Rust core serves ``jaxcluster.v1.ParameterServer`` entirely on its own threads; this
package only parses flags, starts the server and waits for SIGTERM. Variables are created
and used through :class:`jaxcluster.ParameterServerStrategy`, or directly with
``jaxcluster._core.PsClient``.

Example::

    python -m jaxcluster.ps --address 127.0.0.1:0 --index 0
    # jaxcluster ps listening on 127.0.0.1:40123
"""

from __future__ import annotations

__all__: list[str] = []
