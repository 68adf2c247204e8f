"""What a resume compares before it writes: the new run's record against the run.json it finds.

`lmsuite train --model_dir=D` on a D that holds a run resumes from D's newest checkpoint, so the
new run must be the same run: `check_resume` reads D's run.json before anything in D is
rewritten, and `compare` says what differs.

  model_config, recipe            must not change (the checkpoint would not restore, and the
                                  old run's record would be lost): refused; except
                                  ModelConfig.remat, which changes what the backward pass
                                  keeps, not the parameters or the numbers
  batch_size, task, sequence_length, text_task, the recipe's packing
                                  change the data stream: refused unless `data_change` says
                                  how the data position follows (`DATA_CHANGES`)
  stages (`train.stages`)         may change from the data position on (a stage added or
                                  moved later, a later stage's rates); a change before it
                                  (the stages the run has read, the stage it is in) would
                                  make the run's record untrue and its stream skip into
                                  another sample: refused unless `data_change` is 'restart'
  anything else                   (steps, learning rate, schedule, evaluation, the recipe's
                                  loss options and task weights, ...) resumes as given;
                                  run.json then records the new values, which `lmsuite eval`
                                  scores with

  >>> plan = compare(old_record, new_record, data_change="rescale")  # batch 8 -> 16
  >>> data_position(plan, batches_consumed=10)
  5
"""

import dataclasses
import json
from typing import Any

from etils import epath

from lmsuite.models import ModelConfig
from lmsuite.training.train_config import DATA_CHANGES, InvalidRunError

# ModelConfig fields a resume may change: they decide memory, not parameters or results.
MEMORY_ONLY_FIELDS = ("remat",)
# The record's fields whose change alters the data stream (`train.data_change` decides).
DATA_FIELDS = ("batch_size", "task", "sequence_length", "text_task", "pack", "shuffle_buffer_size")


@dataclasses.dataclass(frozen=True)
class DataPlan:
    """How a resume turns the checkpoint's `batches_consumed` into the new run's position:
    `change` None keeps it; "rescale" scales it by `old_batch / new_batch`; "restart" is 0."""

    change: str | None = None
    old_batch: int | None = None
    new_batch: int | None = None


def data_position(plan: DataPlan, batches_consumed: int) -> int:
    """The batches of the new run's stream to skip on resuming at `batches_consumed`.

    Example: rescale 8 -> 16, 10 batches consumed (80 examples) -> 5; 8 -> 3, 10 -> 26 (78
    examples: up to one new batch is repeated or skipped by the rounding).
    """
    if plan.change is None:
        return batches_consumed
    if plan.change == "restart":
        return 0
    if plan.change == "rescale":
        return batches_consumed * plan.old_batch // plan.new_batch
    raise ValueError(f"DataPlan.change must be None or one of {DATA_CHANGES}, got {plan.change!r}")


def check_resume(
    run_file: epath.Path,
    new: dict[str, Any],
    *,
    data_change: str | None,
    batches_consumed: int = 0,
) -> DataPlan:
    """The `DataPlan` for resuming as the run `new` (`TrainConfig.run_record()`) where
    `run_file` (a run.json) may record a run already, whose newest checkpoint had consumed
    `batches_consumed` batches; reads, never writes.

    Raises:
      InvalidRunError: `compare`'s problems, or a `run_file` that is not JSON, each line
        naming `run_file`.
    """
    if not run_file.exists():
        return DataPlan()  # a new run
    try:
        old = json.loads(run_file.read_text())
        if not isinstance(old, dict):
            raise ValueError(f"holds {type(old).__name__}, not a JSON object")
        return compare(old, new, data_change=data_change, batches_consumed=batches_consumed)
    except ValueError as error:
        problems = getattr(error, "problems", [str(error)])
        raise InvalidRunError(
            [f"resuming the run recorded in {run_file}: {p}" for p in problems]
        ) from error


def compare(
    old: dict[str, Any],
    new: dict[str, Any],
    *,
    data_change: str | None,
    batches_consumed: int = 0,
) -> DataPlan:
    """The `DataPlan` for resuming the run recorded as `old` (run.json), which had consumed
    `batches_consumed` batches, as the run `new` (`TrainConfig.run_record()`).

    Raises:
      InvalidRunError: a changed model config or recipe (each differing field named, old ->
        new), a changed batch, task, lengths or text task without a `data_change` that
        allows it, or stages changed before the data position (`schedule_problem`).
    """
    problems = []
    changed_model = _model_differences(old.get("model_config"), new["model_config"])
    if old.get("recipe") != new["recipe"]:
        changed_model.append(f"recipe {old.get('recipe')!r} -> {new['recipe']!r}")
    if changed_model:
        problems.append(
            f"the model differs: {', '.join(changed_model)}; a resume continues the same model "
            "and recipe: use a new model_dir for a new run"
        )

    changed_data = [name for name in DATA_FIELDS if _data_field_changed(old, new, name)]
    plan = DataPlan()
    if changed_data:
        shown = ", ".join(f"{n} {_field(old, n)!r} -> {_field(new, n)!r}" for n in changed_data)
        if data_change is None:
            problems.append(
                f"the data differ: {shown}; set "
                "train.data_change='rescale' (a changed batch size only: keep the examples "
                "consumed) or 'restart' (read the data from its beginning), or use a new model_dir"
            )
        elif data_change == "rescale" and changed_data != ["batch_size"]:
            problems.append(
                f"the data differ: {shown}; train.data_change='rescale' "
                "only rescales a changed batch size: a changed task or lengths needs 'restart'"
            )
        else:
            plan = DataPlan(
                change=data_change, old_batch=old.get("batch_size"), new_batch=new["batch_size"]
            )
    changed_schedule = schedule_problem(old, new, data_position(plan, batches_consumed))
    if changed_schedule and data_change == "restart":
        plan = DataPlan(
            change="restart", old_batch=old.get("batch_size"), new_batch=new["batch_size"]
        )
    elif changed_schedule:
        problems.append(changed_schedule)
    if problems:
        raise InvalidRunError(problems)
    return plan


def schedule_problem(old: dict[str, Any], new: dict[str, Any], position: int) -> str | None:
    """What is wrong with resuming `old`'s continual schedule (run.json's "stages") as `new`'s
    at data position `position` (the batches the new run skips), or None.

    The batches before `position` were read by the stages that start before it; those must be
    the same stages (starts and rates) in both runs, and a run must not gain or lose its
    schedule there. Stages from `position` on are the run's future and may change: a stage
    added at the position starts there. At position 0 (a new run) nothing was read and
    anything goes; `compare` lets `data_change='restart'` read the new stages from batch 0.

    Example: stages from 0 and 1000, resumed at 1500 with the second from 1200: refused (batches
    1000-1199 came from the first stage's sample); with a third stage from 2000 added: resumed.
    """
    if position <= 0:
        return None
    old_read, new_read = (_stages_before(record, position) for record in (old, new))
    if old_read == new_read:
        return None
    if old_read is None or new_read is None:
        detail = (
            "the run has no stages and the resume has"
            if old_read is None
            else "the run has stages and the resume has none"
        )
    else:
        i = next(
            (i for i, (a, b) in enumerate(zip(old_read, new_read, strict=False)) if a != b),
            min(len(old_read), len(new_read)),
        )
        detail = f"stage {i + 1} {_stage_text(old_read, i)} -> {_stage_text(new_read, i)}"
    return (
        f"the stages differ before the data position ({position} batches read): {detail}; the "
        f"batches read so far followed the run's stages: change only stages that start at batch "
        f"{position} or later, set train.data_change='restart' (read the data from its "
        "beginning), or use a new model_dir"
    )


def _stages_before(record: dict[str, Any], position: int) -> list | None:
    """`record`'s stages (as JSON) that start before `position`; None for a run without."""
    stages = record.get("stages")
    if not stages:
        return None
    return [stage for stage in _as_json(stages) if stage[0] < position]


def _stage_text(stages: list, i: int) -> str:
    if i >= len(stages):
        return "none"
    start, rates = stages[i]
    return f"from batch {start} at {rates}"


def _field(record: dict[str, Any], name: str) -> Any:
    if name == "pack":  # `recipes.RecipeChoice.to_json`'s
        return record.get("recipe_options", {}).get("pack")
    return record.get(name)


def _data_field_changed(old: dict[str, Any], new: dict[str, Any], name: str) -> bool:
    if (name == "batch_size" and "batch_size" not in old) or (
        name == "pack" and "recipe_options" not in old
    ):
        # run.json written before the field was recorded: the old value is unknown, and a
        # resume that cannot know it is not refused on it (as before it was recorded).
        return False
    # JSON on both sides: the new record's tuples read as the old one's lists.
    return _as_json(_field(old, name)) != _as_json(_field(new, name))


def _model_differences(old: Any, new: dict[str, Any]) -> list[str]:
    """Each model config field that differs, as "key old -> new" (nested options dotted)."""
    try:
        # Through ModelConfig, so fields added since the old run take their defaults.
        old = ModelConfig.from_json(old).to_json()
    except (TypeError, ValueError, AttributeError) as error:
        return [f"model_config does not read as this lmsuite's ModelConfig ({error})"]
    old_flat, new_flat = _flat(_as_json(old)), _flat(_as_json(new))
    return [
        f"{key} {old_flat.get(key)!r} -> {new_flat.get(key)!r}"
        for key in sorted(set(old_flat) | set(new_flat))
        if old_flat.get(key) != new_flat.get(key) and key not in MEMORY_ONLY_FIELDS
    ]


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))
