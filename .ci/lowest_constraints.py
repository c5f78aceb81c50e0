"""Prints a pip constraints file pinning every dependency pyproject.toml declares (the
runtime ones and the given extras, including extras an extra names, such as
``jaxcluster[all]`` inside ``test``) to its lower bound: ``name>=1.2`` becomes
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


def requirements_of(project: dict, extras: list[str]) -> list[str]:
    """The runtime requirements plus those of ``extras``, following self-references such as
    ``jaxcluster[k8s,gcp]`` inside an extra (each extra once)."""
    optional = project.get("optional-dependencies", {})
    requirements = list(project.get("dependencies", []))
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise KeyError(f"unknown extra {extra!r}; pyproject.toml has {sorted(optional)}")
        seen.add(extra)
        for requirement in optional[extra]:
            match = REQUIREMENT.match(requirement)
            if match and match.group(1).lower() == project["name"].lower():
                pending.extend(e.strip() for e in (match.group(2) or "[]")[1:-1].split(",") if e)
            else:
                requirements.append(requirement)
    return requirements


def main(extras: list[str]) -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    try:
        requirements = requirements_of(project, extras)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    pins: dict[str, str] = {}
    for requirement in requirements:
        match = REQUIREMENT.match(requirement)
        if match is None:
            print(f"cannot parse requirement {requirement!r}", file=sys.stderr)
            return 2
        name, _extras, specifiers, marker = match.groups()
        version = lower_bound(specifiers)
        if version is not None:
            pins[name.lower()] = f"{name}=={version}" + (f" {marker}" if marker else "")
    print("\n".join(pins[name] for name in sorted(pins)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
