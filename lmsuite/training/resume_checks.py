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
  anything else                   (steps, learning rate, schedule, evaluation, stages, the
                                  recipe's loss options and task weights, ...) resumes as
                                  given; run.json then records the new values, which
                                  `lmsuite eval` scores with

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


def check_resume(run_file: epath.Path, new: dict[str, Any], *, data_change: str | None) -> DataPlan:
    """The `DataPlan` for resuming as the run `new` (`TrainConfig.run_record()`) where
    `run_file` (a run.json) may record a run already; reads, never writes.

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
        return compare(old, new, data_change=data_change)
    except ValueError as error:
        problems = getattr(error, "problems", [str(error)])
        raise InvalidRunError(
            [f"resuming the run recorded in {run_file}: {p}" for p in problems]
        ) from error


def compare(old: dict[str, Any], new: dict[str, Any], *, data_change: str | None) -> DataPlan:
    """The `DataPlan` for resuming the run recorded as `old` (run.json) as the run `new`
    (`TrainConfig.run_record()`).

    Raises:
      InvalidRunError: a changed model config or recipe (each differing field named, old ->
        new), or a changed batch, task, lengths or text task without a `data_change` that
        allows it.
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
    if problems:
        raise InvalidRunError(problems)
    return plan


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
