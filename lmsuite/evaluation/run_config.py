"""What a finished run says about its model: the ModelConfig, task, lengths and recipe.

`lmsuite train` writes `run.json` next to the checkpoints (`ModelConfig.to_json` and the run's
task, sequence lengths and recipe), so a loaded model is rebuilt without gin, which belongs to
`lmsuite.cli` alone: the operative `config.gin` beside it is for people and for rerunning.

  >>> run = read_run_config("runs/default")
  >>> run.model_config.d_model, run.task, run.sequence_length
  (64, 'wiki_sample_bert_mlm', {'input_ids': 128, 'masked_ids': 20})
"""

import dataclasses
import json
import os

from lmsuite.models import ModelConfig

RUN_FILE = "run.json"  # written by lmsuite.cli (`cli.RUN_FILE`)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The parts of a run's configuration a loaded model needs."""

    model_config: ModelConfig
    task: str | None
    sequence_length: dict[str, int] | None
    recipe: str | None


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
    )


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
