"""``jaxcluster tls``: make a private CA and server certificates for a cluster's tasks.

    jaxcluster tls make-ca DIR                  # DIR/ca.pem, DIR/ca.key
    jaxcluster tls issue DIR n1 n2 10.0.0.7     # DIR/server.pem, DIR/server.key

Then serve with ``--tls-cert DIR/server.pem --tls-key DIR/server.key`` and point clients at
the CA (``tls_ca="DIR/ca.pem"`` or ``JAXCLUSTER_TLS_CA=DIR/ca.pem``). Needs
``pip install 'jaxcluster[tls]'``. Exit status 0 on success, 2 with one line on stderr when
something is wrong (a file already there, a bad host name, the extra missing).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``make-ca`` and ``issue`` to ``parser``."""
    actions = parser.add_subparsers(dest="tls_action", metavar="ACTION", required=True)
    make_ca = actions.add_parser(
        "make-ca",
        help="create a CA: DIR/ca.pem (give it to clients) and DIR/ca.key (keep it private)",
        description="Create a CA: DIR/ca.pem, which clients trust, and DIR/ca.key (mode 0600).",
    )
    make_ca.add_argument("directory", metavar="DIR", help="where to write (created if missing)")
    make_ca.add_argument(
        "--common-name", default="jaxcluster CA", help="the CA's name (default: jaxcluster CA)"
    )
    issue = actions.add_parser(
        "issue",
        help="sign a server certificate for HOSTs with the CA in DIR",
        description="Sign a server certificate for every HOST (DNS name or IP address) a "
        "client dials, with the CA in DIR; writes DIR/NAME.pem and DIR/NAME.key (mode 0600).",
    )
    issue.add_argument("directory", metavar="DIR", help="directory holding ca.pem and ca.key")
    issue.add_argument("hosts", metavar="HOST", nargs="+", help="a name or address clients dial")
    issue.add_argument(
        "--name", default="server", help="file stem of the certificate and key (default: server)"
    )
    for sub in (make_ca, issue):
        sub.add_argument(
            "--days", type=int, default=365, help="days the certificate is valid (default 365)"
        )
        sub.add_argument("--force", action="store_true", help="overwrite files that already exist")


def run(args: argparse.Namespace) -> int:
    """Runs ``make-ca`` or ``issue``; prints the files written."""
    from jaxcluster import pki

    try:
        if args.tls_action == "make-ca":
            ca = pki.make_ca(
                args.directory, common_name=args.common_name, days=args.days, force=args.force
            )
            written = [ca, ca.with_name(pki.CA_KEY_FILE)]
        else:
            written = list(
                pki.issue(
                    args.directory, args.hosts, name=args.name, days=args.days, force=args.force
                )
            )
    except (ImportError, OSError, ValueError, TypeError) as exc:
        print(f"jaxcluster tls {args.tls_action}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    for path in written:
        print(path)
    return 0
