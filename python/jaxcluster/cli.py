"""The ``jaxcluster`` command line (also ``python -m jaxcluster``).

Each subcommand is a module of :mod:`jaxcluster.commands` with ``add_arguments(parser)`` and
``run(args) -> int``. Only the chosen subcommand's module is imported, so ``jaxcluster
resolve`` never pays for the worker's imports; a subcommand whose module is not installed is
not offered.

Example::

    $ jaxcluster resolve --format env
    export TF_CONFIG='{"cluster": {"worker": ["n1:8888", "n2:8888"]}, ...}'
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

from jaxcluster import __version__

__all__ = ["COMMANDS", "main"]

#: Subcommand -> (module, one-line help), in the order ``--help`` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "worker": ("jaxcluster.commands.worker", "run a worker process that executes closures"),
    "ps": ("jaxcluster.commands.ps", "run a parameter-server process"),
    "resolve": (
        "jaxcluster.commands.resolve",
        "detect the cluster this process is in and print it (json, env or explain)",
    ),
    "status": (
        "jaxcluster.commands.status",
        "show every worker's and ps task's state, closures, uptime and last error",
    ),
    "demo": ("jaxcluster.commands.demo", "train a small JAX model on a local cluster"),
    "tls": (
        "jaxcluster.commands.tls",
        "make a private CA (make-ca) and server certificates (issue) for TLS",
    ),
}


def _available() -> dict[str, tuple[str, str]]:
    """The subcommands whose modules exist (found without importing them)."""
    return {
        name: entry
        for name, entry in COMMANDS.items()
        if importlib.util.find_spec(entry[0]) is not None
    }


def _chosen(argv: Sequence[str], commands: dict[str, tuple[str, str]]) -> str | None:
    # The first positional token is the subcommand: the top level has only flags.
    for token in argv:
        if not token.startswith("-"):
            return token if token in commands else None
    return None


def _build_parser(
    commands: dict[str, tuple[str, str]], chosen: str | None
) -> tuple[argparse.ArgumentParser, ModuleType | None]:
    parser = argparse.ArgumentParser(
        prog="jaxcluster",
        description="TF-style cluster resolvers and a ClusterCoordinator for JAX.",
    )
    parser.add_argument("--version", action="version", version=f"jaxcluster {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    module = None
    for name, (module_name, help_text) in commands.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
    return parser, module


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    commands = _available()
    parser, module = _build_parser(commands, _chosen(args_list, commands))
    args = parser.parse_args(args_list)
    # The subcommand's own flags, for a command that starts itself again (a slice host's
    # supervisor).
    args.raw_argv = args_list[args_list.index(args.command) + 1 :]
    if module is None:  # pragma: no cover - argparse rejects unknown commands first
        parser.error(f"unknown command {args.command!r}")
    try:
        return int(module.run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
