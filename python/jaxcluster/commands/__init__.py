"""Subcommands of the ``jaxcluster`` command line, one module each.

A subcommand module defines ``add_arguments(parser: argparse.ArgumentParser) -> None`` and
``run(args: argparse.Namespace) -> int`` (the exit status), and is listed in
``jaxcluster.cli.COMMANDS``. Modules are imported only when their subcommand runs.
"""
