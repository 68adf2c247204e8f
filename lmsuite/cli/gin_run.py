"""gin's side of `TrainConfig`: the `train.*` bindings mapped onto the run's groups, and
`run_from_gin`, a gin-built run for Python callers (the notebooks).

The gin configurable `train` keeps the flat parameters experiments bind (`train.eval_every`,
`train.input_threads`, ...); each lands in one group of `lmsuite.training.train_config`. The
optimizer and schedule are `OptimizerConfig` and `ScheduleConfig`, registered under their gin
names `make_optimizer` and `make_schedule`.

  >>> run = run_from_gin("experiments/smoke.gin", model_dir="runs/smoke",
  ...                    bindings={"TRAIN_STEPS": 10})
  >>> lmsuite.train(run)
"""

import types
from collections.abc import Mapping, Sequence
from typing import Any

# gin's `train` parameter -> (group, field); a None field is the group itself.
TRAIN_PARAMETERS: dict[str, tuple[str, str | None]] = {
    "model_config": ("model", None),
    "recipe": ("recipe", None),
    "optimizer": ("optimizer", None),
    "task": ("data", "task"),
    "sequence_length": ("data", "sequence_length"),
    "batch_size": ("data", "batch_size"),
    "eval_split": ("data", "eval_split"),
    "eval_batches": ("data", "eval_batches"),
    "input_threads": ("data", "input_threads"),
    "shuffle_buffer_size": ("data", "shuffle_buffer_size"),
    "input_sharding": ("data", "input_sharding"),
    "input_nice": ("data", "input_nice"),
    "stages": ("data", "stages"),
    "data_change": ("data", "data_change"),
    "train_steps": ("trainer", "train_steps"),
    "seed": ("trainer", "seed"),
    "mesh_shape": ("trainer", "mesh_shape"),
    "rules": ("trainer", "rules"),
    "num_microbatches": ("trainer", "num_microbatches"),
    "log_every": ("trainer", "log_every"),
    "eval_every": ("trainer", "eval_every"),
    "final_eval": ("trainer", "final_eval"),
    "skip_nonfinite": ("trainer", "skip_nonfinite"),
    "progress_bar": ("trainer", "progress_bar"),
    "peak_flops_per_device": ("trainer", "peak_flops_per_device"),
    "prng_impl": ("trainer", "prng_impl"),
    "checkpoint_every": ("checkpointing", "every"),
    "keep_checkpoints": ("checkpointing", "keep"),
    "checkpoint_nice": ("checkpointing", "nice"),
}
# Accepted for gin files written before the run config: the optimizer's schedule, which the
# step logs; it must be the optimizer's own.
LEARNING_RATE_FN = "learning_rate_fn"


def train_config(
    arguments: Mapping[str, Any],
    *,
    model_dir: str,
    task_modules: Sequence[str] = (),
    operative_config: str | None = None,
):
    """The `TrainConfig` of gin's evaluated `train` arguments.

    Raises:
      ValueError: an unknown parameter, or a `learning_rate_fn` other than the optimizer's.
      TypeError: a required group field that is not bound, or a group of the wrong type.
    """
    from lmsuite.training import train_config as tc

    unknown = sorted(set(arguments) - set(TRAIN_PARAMETERS) - {LEARNING_RATE_FN})
    if unknown:
        raise ValueError(
            f"train has no parameters {unknown}; expected some of {sorted(TRAIN_PARAMETERS)}"
        )
    fields: dict[str, dict[str, Any]] = {"data": {}, "trainer": {}, "checkpointing": {}}
    groups: dict[str, Any] = {}
    for name, value in arguments.items():
        if name == LEARNING_RATE_FN:
            continue
        group, field = TRAIN_PARAMETERS[name]
        if field is None:
            groups[group] = value
        else:
            fields[group][field] = value
    schedule = arguments.get(LEARNING_RATE_FN)
    optimizer = groups.get("optimizer")
    if schedule is not None and schedule != getattr(optimizer, "learning_rate", None):
        raise ValueError(
            f"train.learning_rate_fn ({schedule!r}) is not the optimizer's learning rate "
            f"({getattr(optimizer, 'learning_rate', None)!r}); the step logs the optimizer's "
            "own: drop train.learning_rate_fn"
        )
    return tc.TrainConfig(
        data=tc.DataConfig(**fields["data"], task_modules=tuple(task_modules)),
        trainer=tc.TrainerConfig(**fields["trainer"]),
        checkpointing=tc.CheckpointConfig(model_dir=model_dir, **fields["checkpointing"]),
        operative_config=operative_config,
        **groups,
    )


def train_arguments(run) -> dict[str, Any]:
    """The run as the flat keyword arguments gin's `train` binds, the recipe built and the
    optimizer made (what `lmsuite compile` hands `aot.compile_train_step`)."""
    groups = {
        "model": run.model,
        "recipe": run.built(),
        "data": run.data,
        "trainer": run.trainer,
        "checkpointing": run.checkpointing,
    }
    out = {}
    for name, (group, field) in TRAIN_PARAMETERS.items():
        if group == "optimizer":
            continue
        out[name] = groups[group] if field is None else getattr(groups[group], field)
    out["optimizer"], out[LEARNING_RATE_FN] = run.optimizer.build(
        train_steps=run.trainer.train_steps
    )
    return out


def run_from_gin(
    gin_files: str | Sequence[str],
    *,
    model_dir: str,
    bindings: Mapping[str, Any] | Sequence[str] = (),
    gin_search_paths: Sequence[str] = (),
    task_modules: Sequence[str] = (),
    tfds_data_dir: str | None = None,
):
    """The checked `TrainConfig` that gin files (searched in the working directory,
    `gin_search_paths`, then lmsuite's own gin/) and bindings describe, as `lmsuite train`
    builds it: `bindings` as {"TRAIN_STEPS": 10, "train.eval_batches": 2} (values written as
    Python literals) or as strings "TRAIN_STEPS = 10".

    Raises:
      ConfigError (a ValueError): every problem at once, as `lmsuite train` lists them.
    """
    from lmsuite.cli import config

    files = [gin_files] if isinstance(gin_files, str) else list(gin_files)
    if isinstance(bindings, Mapping):
        lines = [f"{key} = {value!r}" for key, value in bindings.items()]
    else:
        lines = [b.replace("=", " = ", 1) if " = " not in b else b for b in bindings]
    args = types.SimpleNamespace(
        gin_file=files,
        gin_bindings=lines,
        gin_search_paths=list(gin_search_paths),
        task_module=list(task_modules),
        tfds_data_dir=tfds_data_dir,
        model_dir=model_dir,
    )
    return config.load_run(args)
