"""Fails unless a release tag names the version the package builds as.

The version comes from Cargo.toml's ``[package] version`` (pyproject.toml declares it
dynamic, so maturin takes it from there). Tag ``v0.1.0`` matches ``0.1.0``; a Cargo
pre-release ``0.2.0-rc.1`` is published as PEP 440 ``0.2.0rc1`` and matches either spelling.

Usage: ``python .github/check_version.py v0.1.0``
"""

import re
import sys
import tomllib
from pathlib import Path


def pep440(version: str) -> str:
    """Cargo's ``X.Y.Z-alpha.N`` / ``-beta.N`` / ``-rc.N`` as maturin writes them."""
    match = re.fullmatch(r"(\d+\.\d+\.\d+)(?:-(alpha|beta|rc)\.?(\d+))?", version)
    if match is None:
        return version
    base, kind, number = match.groups()
    return (
        base if kind is None else f"{base}{ {'alpha': 'a', 'beta': 'b', 'rc': 'rc'}[kind] }{number}"
    )


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    tag = sys.argv[1]
    cargo = Path(__file__).resolve().parent.parent / "Cargo.toml"
    version = tomllib.loads(cargo.read_text())["package"]["version"]
    wanted = {f"v{version}", f"v{pep440(version)}"}
    if tag not in wanted:
        print(
            f"tag {tag!r} does not match the package version {version!r} (Cargo.toml): "
            f"tag {sorted(wanted)[0]!r}, or bump Cargo.toml's version and tag again",
            file=sys.stderr,
        )
        return 1
    print(f"tag {tag} matches version {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
