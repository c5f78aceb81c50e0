"""Prints a pip constraints file pinning every dependency pyproject.toml declares (the
runtime ones and the given extras) to its lower bound: ``name>=1.2`` becomes
``name==1.2``. CI installs with it to test the bottom of every declared range.

Usage: python .ci/lowest_constraints.py [EXTRA ...] > constraints.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*(;.*)?$")


def lower_bound(specifiers: str) -> str | None:
    for spec in specifiers.split(","):
        spec = spec.strip()
        if spec.startswith(">=") or spec.startswith("=="):
            return spec[2:].strip()
        if spec.startswith("~="):
            return spec[2:].strip()
    return None


def main(extras: list[str]) -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            print(f"unknown extra {extra!r}; pyproject.toml has {sorted(optional)}", file=sys.stderr)
            return 2
        requirements.extend(optional[extra])
    pins: dict[str, str] = {}
    for requirement in requirements:
        match = REQUIREMENT.match(requirement)
        if match is None:
            print(f"cannot parse requirement {requirement!r}", file=sys.stderr)
            return 2
        name, _extras, specifiers, marker = match.groups()
        if name.lower() == project["name"].lower():
            continue  # a self-reference such as jaxcluster[test] in an extra
        version = lower_bound(specifiers)
        if version is not None:
            pins[name.lower()] = f"{name}=={version}" + (f" {marker}" if marker else "")
    print("\n".join(pins[name] for name in sorted(pins)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
