"""What every group of the run config (`train_config`, `optimizer_config`) shares.

A group is a frozen dataclass with `replace`. Its checks add one message per bad value to a
list, naming the setting, what it must be and what came, instead of raising at the first: so
`TrainConfig.check` can report every problem of a run at once (`InvalidRunError`).
"""

import dataclasses
import math
from typing import Any

from lmsuite.training import thread_priority


class Group:
    def replace(self, **changes):
        """A copy with `changes` (dataclasses.replace)."""
        return dataclasses.replace(self, **changes)


def positive_int(problems: list[str], where: str, value: Any, *, zero: bool = False) -> None:
    """Adds a problem unless `value` is an int >= 1 (>= 0 with `zero`)."""
    least = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        problems.append(f"{where} must be an integer >= {least}, got {value!r}")


def nice_value(problems: list[str], where: str, value: Any) -> None:
    """Adds a problem unless `value` is None or a thread nice value this host can set."""
    if value is not None:
        try:
            thread_priority.check(value, what=where)
        except ValueError as error:
            problems.append(str(error))


def is_count(value: Any, least: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def finite_rate(problems: list[str], where: str, value: Any, *, zero: bool = False) -> None:
    """Adds a problem unless `value` is a finite number > 0 (>= 0 with `zero`)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        least = ">= 0" if zero else "> 0"
        problems.append(f"{where} must be a finite number {least}, got {value!r}")
