"""What a finished run says about its model: the ModelConfig, task, lengths and recipe.

`lmsuite train` writes `run.json` next to the checkpoints (`ModelConfig.to_json` and the run's
task, sequence lengths, recipe and the recipe's options), so a loaded model is rebuilt without
gin, which belongs to `lmsuite.cli` alone: the operative `config.gin` beside it is for people
and for rerunning. It also records what registers the task: the `--task_module`s and, for
`--train_files`, the text task's spec (`text_files.TextTaskSpec`); `register_run_tasks` imports
and registers them again (runs written before these keys load as before: their task must be
registered by the caller).

  >>> run = read_run_config("runs/default")
  >>> run.model_config.d_model, run.task, run.sequence_length
  (64, 'wiki_sample_bert_mlm', {'input_ids': 128, 'masked_ids': 20})
"""

import dataclasses
import importlib
import json
import os
from collections.abc import Mapping

from lmsuite.models import ModelConfig

RUN_FILE = "run.json"  # written by lmsuite.cli (`cli.RUN_FILE`)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The parts of a run's configuration a loaded model needs."""

    model_config: ModelConfig
    task: str | None
    sequence_length: dict[str, int] | None
    recipe: str | None
    task_modules: tuple[str, ...] = ()
    text_task: Mapping | None = None  # `text_files.TextTaskSpec.to_json()`
    # `recipes.RecipeChoice.to_json()`: packing, loss options, task weights (None: a run.json
    # written before they were recorded)
    recipe_options: Mapping | None = None


def parse_run_config(text: str, *, where: str = RUN_FILE) -> RunConfig:
    """`RunConfig` from the text of a `run.json`; a ValueError names the file and the problem."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is not JSON: {error}") from error
    if not isinstance(values, dict) or "model_config" not in values:
        raise ValueError(f"{where} holds no 'model_config'; is it the run.json of an lmsuite run?")
    try:
        config = ModelConfig.from_json(values["model_config"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from error
    return RunConfig(
        model_config=config,
        task=values.get("task"),
        sequence_length=values.get("sequence_length"),
        recipe=values.get("recipe"),
        task_modules=tuple(values.get("task_modules", ())),
        text_task=values.get("text_task"),
        recipe_options=values.get("recipe_options"),
    )


def register_run_tasks(run: RunConfig, *, where: str = RUN_FILE) -> None:
    """Imports the run's task modules and registers its text-file task again, so that its TASK
    resolves in a new process; a ValueError names the module or the record that fails."""
    for module in run.task_modules:
        try:
            importlib.import_module(module)
        except Exception as error:  # any failure of the user's module: name it, keep the cause
            raise ValueError(
                f"{where} names the task module {module!r}, which does not import here "
                f"({type(error).__name__}: {error}); make it importable (PYTHONPATH) first"
            ) from error
    if run.text_task is not None:
        from lmsuite.data import text_files

        try:
            text_files.register_recorded(run.text_task)
        except ValueError as error:
            raise ValueError(f"{where}: its text_task does not register: {error}") from error


def read_run_config(model_dir: str | os.PathLike) -> RunConfig:
    """`RunConfig` of the run in `model_dir` (from its `run.json`)."""
    path = os.path.join(os.fspath(model_dir), RUN_FILE)
    if not os.path.isfile(path):
        gin_file = os.path.join(os.fspath(model_dir), "config.gin")
        hint = (
            " (it has a config.gin: the run predates run.json; rerun `lmsuite train` with the "
            "same flags for one step to write it)"
            if os.path.isfile(gin_file)
            else ": it is not an lmsuite run directory"
        )
        raise ValueError(f"{model_dir} has no {RUN_FILE}{hint}")
    with open(path) as f:
        return parse_run_config(f.read(), where=path)
