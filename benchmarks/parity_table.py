"""Prints the HF parity table (benchmarks/RESULTS.md) from the JSON lines `make parity` collects.

One row per family (the worst case over its parity tests), then every comparison.
"""

import collections
import json
import sys


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    rows = [r for r in rows if "round" not in r["what"] and "alone" not in r["what"]]
    family: dict[str, float] = collections.defaultdict(float)
    detail: dict[str, float] = collections.defaultdict(float)
    for row in rows:
        test = row["test"].split("::")
        name = test[0].split("/")[-1].removesuffix(".py").removeprefix("test_")
        family[name] = max(family[name], row["max_abs_diff"])
        key = f"{name}: {test[-1]} ({row['what']})"
        detail[key] = max(detail[key], row["max_abs_diff"])
    print("| family | worst max-abs-diff vs HF torch (float32) |")
    print("|---|---|")
    for name in sorted(family):
        print(f"| {name} | {family[name]:.2e} |")
    print()
    for key in sorted(detail):
        print(f"  {detail[key]:.2e}  {key}")


if __name__ == "__main__":
    main(sys.argv[1])
