"""Continual multi-task schedules: a mixture's tasks joining the training in stages.

ERNIE 2.0 (Sun et al. 2020, §3.2 "continual multi-task learning") adds pre-training tasks one
stage at a time and keeps training every earlier task beside the new ones, so that what the model
learnt first is not forgotten. A schedule is a sequence of `Stage`s over one SeqIO mixture:

  Stage(start=0,    rates={"a": 1})              batches [0, 300): task a only
  Stage(start=300,  rates={"a": 1, "b": 1})      batches [300, 700): a and b, 1:1
  Stage(start=700,  rates={"a": 1, "b": 1, "c": 2})   from batch 700 on: a, b, c at 1:1:2

`start` counts global batches, which is the training step. Each stage keeps every task of the
stage before it (the paper's point; `problems` refuses a schedule that drops one) and may change
their rates. The tasks are the mixture's, so an example's task id (`mixtures.TASK_IDS`) and the
held-out evaluation (the whole mixture at its own rates) are the same in every stage: the held-out
accuracy of each task can be followed across the stages.

`staged` builds the batches: each stage is its own sample of the mixture's tasks at the stage's
rates (seeded `seed + stage index`, so that a task does not replay the examples it began the run
with), batched, cut to the stage's length and concatenated. A resumed run starts in the stage
its position falls in and skips only within that stage, so it sees the batches it would have
seen without replaying the earlier stages.
"""

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from lmsuite import did_you_mean


@dataclasses.dataclass(frozen=True)
class Stage:
    """From global batch `start` on (until the next stage), the mixture's tasks at `rates`."""

    start: int
    rates: Mapping[str, float]

    def __post_init__(self):
        object.__setattr__(self, "rates", dict(self.rates))

    def to_json(self) -> list:
        return [self.start, dict(self.rates)]


def as_stages(value: Any) -> tuple[Stage, ...]:
    """`value` as `Stage`s: each item a `Stage` or a (start, {task: rate}) pair (gin's form).

    Raises:
      ValueError: an item that is neither, naming it.
    """
    out = []
    for i, item in enumerate(value or ()):
        if isinstance(item, Stage):
            out.append(item)
            continue
        if (
            isinstance(item, Sequence)
            and not isinstance(item, str)
            and len(item) == 2
            and isinstance(item[1], Mapping)
        ):
            out.append(Stage(start=item[0], rates=item[1]))
            continue
        raise ValueError(
            f"stage {i} is {item!r}; expected (first step, {{task: rate, ...}}), e.g. "
            "(0, {'wiki_sample_ernie2_capitalization': 1.0})"
        )
    return tuple(out)


def problems(
    stages: Sequence[Stage], *, tasks: Sequence[str], mixture: str, train_steps: int | None = None
) -> list[str]:
    """What is wrong with `stages` over the tasks of `mixture` (empty: nothing).

    The first stage starts at 0, starts increase (and fall before `train_steps`), every rate
    names a task of the mixture and is finite and > 0, and every stage keeps every task of the
    stage before it.
    """
    out: list[str] = []
    if not stages:
        return out
    if not tasks:
        return [f"data.stages schedule the tasks of a mixture, but {mixture!r} is not a mixture"]
    if stages[0].start != 0:
        out.append(f"data.stages: the first stage starts at step {stages[0].start}; expected 0")
    for i, stage in enumerate(stages):
        where = f"data.stages[{i}] (from step {stage.start})"
        if not isinstance(stage.start, int) or isinstance(stage.start, bool) or stage.start < 0:
            out.append(f"{where}: the start must be an int >= 0, got {stage.start!r}")
            continue
        if i and isinstance(stages[i - 1].start, int) and stage.start <= stages[i - 1].start:
            out.append(
                f"{where}: stages must start in increasing order; the stage before starts at "
                f"step {stages[i - 1].start}"
            )
        if train_steps is not None and i and stage.start >= train_steps:
            out.append(f"{where} starts at or after the run's last step ({train_steps} steps)")
        if not stage.rates:
            out.append(f"{where} has no task")
        for task, rate in stage.rates.items():
            if task not in tasks:
                hint = did_you_mean.nearest(str(task), tasks)
                out.append(f"{where}: {task!r} is not a task of mixture {mixture!r}{hint}")
            elif not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
                out.append(f"{where}: the rate of {task!r} must be finite and > 0, got {rate!r}")
        if i:
            dropped = sorted(set(stages[i - 1].rates) - set(stage.rates))
            if dropped:
                out.append(
                    f"{where} drops {dropped}: every stage keeps the tasks of the stage before "
                    "it (continual multi-task learning trains earlier tasks on)"
                )
    return out


def stage_index(stages: Sequence[Stage], batch: int) -> int:
    """The index of the stage global batch `batch` (0-based) falls in.

    Example: starts (0, 300, 700): batch 299 -> 0, batch 300 -> 1, batch 5000 -> 2.
    """
    index = 0
    for i, stage in enumerate(stages):
        if stage.start <= batch:
            index = i
    return index


def staged(
    stages: Sequence[Stage],
    batches: Callable[[int, Mapping[str, float]], tf.data.Dataset],
    *,
    skip_batches: int = 0,
) -> tf.data.Dataset:
    """The batches of every stage in turn, from global batch `skip_batches` on.

    `batches(index, rates)` is stage `index`'s endless dataset of batches at `rates`; stage i
    yields its first `stages[i + 1].start - stages[i].start` batches, the last stage all of its.

    Example: starts (0, 2), skip_batches 3 -> stage 1's batches from its second: global batch 3.
    """
    first = stage_index(stages, skip_batches)
    # Built last stage first: a stage keeps the tasks of the stages before it, so the later
    # stage's pipeline has built every task an earlier one leaves out, and a memo of their
    # features (`mixtures.mixed_examples`) spares the earlier stages building them again.
    built = {i: batches(i, stages[i].rates) for i in reversed(range(first, len(stages)))}
    dataset = None
    for i in range(first, len(stages)):
        ds = built[i]
        if i == first and skip_batches > stages[i].start:
            ds = ds.skip(skip_batches - stages[i].start)
        if i + 1 < len(stages):
            ds = ds.take(stages[i + 1].start - max(stages[i].start, skip_batches))
        dataset = ds if dataset is None else dataset.concatenate(ds)
    return dataset
