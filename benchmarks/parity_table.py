"""Prints the README's HF parity table from the JSON lines `make parity` collects."""

import collections
import json
import sys


def main(path: str) -> None:
    worst: dict[str, float] = collections.defaultdict(float)
    for line in open(path):
        row = json.loads(line)
        if "round-trip" in row["what"]:
            continue
        test = row["test"].split("::")
        key = f"{test[0].split('/')[-1].removesuffix('.py')}::{test[-1]} ({row['what']})"
        worst[key] = max(worst[key], row["max_abs_diff"])
    print("| test (compared output) | max-abs-diff vs HF torch |")
    print("|---|---|")
    for key in sorted(worst):
        print(f"| {key} | {worst[key]:.2e} |")


if __name__ == "__main__":
    main(sys.argv[1])
