"""Writes constraints.txt: the exact versions `pip install '.[test]'` resolved on each Python.

Usage: python .ci/lock.py OUT FREEZE_3_11 FREEZE_3_13 [FREEZE_3_12 ...]
Each FREEZE is `pip freeze --exclude lmsuite` of a fresh venv on that Python, named
`...py3.X.txt`. A package at the same version everywhere gets one line; otherwise one line per
Python with an environment marker, so one file pins 3.11 (the oldest supported stack: jax 0.10.2)
and 3.12/3.13 (the newest) alike.
"""

import re
import sys
from collections import defaultdict


def read_freeze(path: str) -> dict[str, str]:
    pins = {}
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==(\S+)", line)
        if not match:
            raise ValueError(
                f"{path}: expected 'name==version' lines from pip freeze, got {line!r}"
            )
        pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def _markers(having: list[str], pythons: list[str]) -> list[str]:
    """Environment markers selecting `having` among `pythons` (both oldest first): one
    `>=` / `<` marker for a run at either end, else one `==` marker per Python."""
    start = pythons.index(having[0])
    if having == pythons[start : start + len(having)]:
        if start + len(having) == len(pythons):
            return [f'python_version >= "{having[0]}"']
        if start == 0:
            return [f'python_version < "{pythons[len(having)]}"']
    return [f'python_version == "{p}"' for p in having]


def main(out: str, *freezes: str) -> None:
    by_python = {}
    for path in freezes:
        match = re.search(r"py(3\.\d+)\.txt$", path)
        if not match:
            raise ValueError(f"freeze file {path!r} must end in py3.X.txt")
        by_python[match.group(1)] = read_freeze(path)
    versions: dict[str, dict[str, str]] = defaultdict(dict)
    for python, pins in by_python.items():
        for name, version in pins.items():
            versions[name][python] = version
    lines = [
        "# Exact versions of lmsuite's dependencies and its test extra, as resolved on each Python",
        "# (`make lock` writes this file; pyproject.toml holds the ranges). `make install` and CI",
        "# install with `-c constraints.txt`; so can you: pip install -c constraints.txt ...",
    ]
    pythons = sorted(by_python, key=lambda v: tuple(map(int, v.split("."))))
    for name in sorted(versions):
        found = versions[name]
        if len(found) == len(pythons) and len(set(found.values())) == 1:
            lines.append(f"{name}=={found[pythons[0]]}")
            continue
        first_python = {}
        for python in pythons:
            if python in found:
                first_python.setdefault(found[python], pythons.index(python))
        for version in sorted(first_python, key=first_python.get):
            having = [p for p in pythons if found.get(p) == version]
            lines.extend(f"{name}=={version} ; {marker}" for marker in _markers(having, pythons))
    open(out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
