"""One training run's configuration: frozen groups, validated once, trained by `lmsuite.train`.

  data           the task, its lengths, the global batch, held-out evaluation, input threads
  model          the `ModelConfig`
  recipe         the recipe row and its options (`recipes.make_recipe`)
  optimizer      the optimizer and its learning-rate schedule
  trainer        steps, seed, mesh, microbatches, logging and evaluation cadence
  checkpointing  the run directory, how often and how many checkpoints are kept

Built in Python or by gin (`lmsuite.cli` maps the `train.*` bindings and macros onto the groups):

  >>> run = TrainConfig(
  ...     data=DataConfig(task="wiki_sample_bert_mlm", batch_size=8,
  ...                     sequence_length={"input_ids": 64, "masked_ids": 10}),
  ...     model=config, recipe="bert_mlm",
  ...     optimizer=OptimizerConfig(learning_rate=ScheduleConfig(peak_value=1e-3)),
  ...     trainer=TrainerConfig(train_steps=30),
  ...     checkpointing=CheckpointConfig(model_dir="runs/x"))
  >>> lmsuite.train(run)

`validate()` checks every group's values and the run as a whole (`preflight.check_run`: task,
data, recipe, model, vocabulary, mesh) and raises one `InvalidRunError` listing every problem;
it runs once per config (a frozen config cannot change after it passed).

The optimizer group is defined in `optimizer_config`; `OptimizerConfig` and `ScheduleConfig`
are importable from here too, so that a run is written with one import, as above.
"""

import dataclasses
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from lmsuite import partitioning
from lmsuite.data import mixtures
from lmsuite.data import stages as stages_lib
from lmsuite.models import ModelConfig
from lmsuite.training import checkpointing, input_pipeline, preflight, recipes
from lmsuite.training.config_group import Group, finite_rate, is_count, nice_value, positive_int
from lmsuite.training.optimizer_config import OptimizerConfig, ScheduleConfig

# `DataConfig.data_change`: how a resume's data position follows a changed batch, task or
# lengths (`resume_checks`): "rescale" (the batch size only) keeps the examples consumed,
# "restart" reads the data from its beginning.
DATA_CHANGES = ("rescale", "restart")


class InvalidRunError(ValueError):
    """Every problem of a run's configuration, one per line (`problems`); `warnings` are what
    would not have stopped it."""

    def __init__(self, problems: list[str], warnings: list[str] = ()):
        self.problems, self.warnings = list(problems), list(warnings)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"this run cannot start:\n{lines}")


def _mesh_problems(mesh_shape: Any) -> list[str]:
    """What is wrong with a (data, fsdp, tensor) mesh: three integers, each >= 1 or one -1."""
    sizes = tuple(mesh_shape) if isinstance(mesh_shape, list | tuple) else ()
    if len(sizes) != 3 or not all(isinstance(n, int) for n in sizes):
        return [
            f"trainer.mesh_shape must be three integers (data, fsdp, tensor; one may be -1), "
            f"got {mesh_shape!r}"
        ]
    if not all(n == -1 or n >= 1 for n in sizes) or sizes.count(-1) > 1:
        return [
            f"trainer.mesh_shape sizes must each be >= 1, or -1 for at most one of them (it "
            f"takes the devices the others leave), got {mesh_shape!r}"
        ]
    return []


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig(Group):
    """What the run reads: the SeqIO task or mixture, its feature lengths, the global batch,
    the held-out batches evaluation reads, and the input pipeline's threads.

    `task_modules` are imported before the task is looked up (modules that register it) and
    recorded in run.json, so `lmsuite.load` registers the task again. `input_sharding` is
    `input_pipeline.process_dataset`'s ("replicated": batches independent of the host count).
    `stages` is a continual schedule over mixture `task` (`lmsuite.data.stages`: `Stage`s or
    (first step, {task: rate}) pairs); empty: the mixture's own rates throughout.
    `shuffle_buffer_size` is each task's training shuffle buffer in examples (None: the task's
    own, SeqIO's 1,000; `input_pipeline.process_dataset`).
    `data_change` lets a resume change the batch size, task or lengths of the run it resumes
    (`DATA_CHANGES`; None: such a resume is refused, `lmsuite.training.resume_checks`).
    """

    task: str
    sequence_length: Mapping[str, int]
    batch_size: int
    eval_split: str = input_pipeline.EVAL_SPLIT
    eval_batches: int = input_pipeline.EVAL_BATCHES
    input_threads: int | None = None
    shuffle_buffer_size: int | None = None
    input_sharding: str = "source"
    input_nice: int | None = None
    task_modules: tuple[str, ...] = ()
    stages: tuple[stages_lib.Stage, ...] = ()
    data_change: str | None = None

    def __post_init__(self):
        if isinstance(self.sequence_length, Mapping):  # else kept as given: `problems` names it
            object.__setattr__(self, "sequence_length", dict(self.sequence_length))
        object.__setattr__(self, "task_modules", tuple(self.task_modules))
        try:
            object.__setattr__(self, "stages", stages_lib.as_stages(self.stages))
        except (TypeError, ValueError):
            pass  # kept as given: `problems` names it

    def problems(self) -> list[str]:
        out: list[str] = []
        if not isinstance(self.task, str) or not self.task:
            out.append(f"data.task must be a task or mixture name, got {self.task!r}")
        if not isinstance(self.sequence_length, Mapping):
            out.append(
                "data.sequence_length must map each feature to its length, e.g. "
                f"{{'input_ids': 128, 'masked_ids': 20}}, got {self.sequence_length!r}"
            )
        else:
            for key, length in self.sequence_length.items():
                positive_int(out, f"data.sequence_length[{key!r}]", length)
        positive_int(out, "data.batch_size", self.batch_size)
        positive_int(out, "data.eval_batches", self.eval_batches)
        if self.input_threads is not None:
            positive_int(out, "data.input_threads", self.input_threads)
        if self.shuffle_buffer_size is not None:
            positive_int(out, "data.shuffle_buffer_size", self.shuffle_buffer_size)
        nice_value(out, "data.input_nice", self.input_nice)
        if self.input_sharding not in input_pipeline.INPUT_SHARDINGS:
            out.append(
                f"data.input_sharding must be one of {input_pipeline.INPUT_SHARDINGS}, got "
                f"{self.input_sharding!r}"
            )
        try:
            stages_lib.as_stages(self.stages)
        except (TypeError, ValueError) as error:
            out.append(f"data.stages: {error}")
        if self.data_change is not None and self.data_change not in DATA_CHANGES:
            out.append(
                f"data.data_change must be None or one of {DATA_CHANGES}, got {self.data_change!r}"
            )
        return out

    def stage_problems(self, *, recipe: recipes.Recipe, train_steps: int) -> list[str]:
        """What is wrong with `stages` for this task, `recipe` and `train_steps` (registered
        tasks needed: call after the task modules are imported)."""
        if not self.stages or not all(isinstance(s, stages_lib.Stage) for s in self.stages):
            return []
        import lmsuite.data.tasks  # noqa: F401  (registers the built-in mixtures)

        out = stages_lib.problems(
            self.stages,
            tasks=mixtures.task_names(self.task),
            mixture=self.task,
            train_steps=train_steps,
        )
        if recipe.rows_task is not None:
            out.append(
                f"data.stages: recipe {recipe.name!r} reads its task as rows of streams, in "
                "order; a staged schedule needs shuffled examples of a mixture"
            )
        return out

    def train_dataset(self, recipe: recipes.Built, *, seed: int, **options):
        """The training batches of `recipe` (built lazily; `options`: shuffle, repeat,
        skip_batches, ...), staged by `stages`."""
        return input_pipeline.process_dataset(
            **self._pipeline(recipe),
            split="train",
            seed=seed,
            input_threads=self.input_threads,
            stages=self.stages,
            shuffle_buffer_size=self.shuffle_buffer_size,
            **options,
        )

    def eval_dataset(self, recipe: recipes.Built):
        """The held-out batches evaluation reads: `eval_batches` of `eval_split`, in order."""
        return input_pipeline.eval_dataset(
            **self._pipeline(recipe), split=self.eval_split, batches=self.eval_batches
        )

    def _pipeline(self, recipe: recipes.Built) -> dict[str, Any]:
        return dict(
            task=self.task,
            sequence_length=self.sequence_length,
            feature_converter=recipe.feature_converter,
            global_batch_size=self.batch_size,
            input_sharding=self.input_sharding,
            rows_task=recipe.recipe.rows_task,
            task_ids_along=recipe.task_ids_along,
            label_fill=dict(recipe.objective.label_heads) or None,
        )


PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig(Group):
    """How the loop runs: `train_steps` optimizer updates from `seed` (data order, initial
    parameters, dropout) on a (data, fsdp, tensor) `mesh_shape` with `rules`.

    `final_eval` evaluates at the last step when `eval_every` (0: never) does not; `skip_nonfinite`
    skips a NaN/Inf update instead of stopping; `peak_flops_per_device` (None: this device's
    table value, measured on CPU) is the MFU's denominator.

    `prng_impl` makes the dropout bits (`step.dropout_key`): "threefry2x32" (JAX's default: the
    same bits on every backend and mesh, what the bitwise tests use) computes them with integer
    ops on the vector unit, which on a TPU can cost more than the step's matmuls; "rbg" and
    "unsafe_rbg" use XLA's RngBitGenerator, the TPU's hardware generator ("unsafe_rbg" also
    derives the per-step and per-layer keys more cheaply, with weaker statistical guarantees
    between streams). Every choice is deterministic for one backend and mesh, so a resume stays
    bitwise; runs with different choices draw different dropout masks.
    """

    train_steps: int
    seed: int = 0
    mesh_shape: Sequence[int] = (-1, 1, 1)
    rules: partitioning.Rules = partitioning.DEFAULT_RULES
    num_microbatches: int = 1
    log_every: int = 10
    eval_every: int = 0
    final_eval: bool = True
    skip_nonfinite: bool = False
    progress_bar: bool = True
    peak_flops_per_device: float | None = None
    prng_impl: str = "threefry2x32"

    def __post_init__(self):
        if isinstance(self.mesh_shape, list | tuple):  # else kept as given: `problems` names it
            object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        object.__setattr__(self, "rules", tuple((name, axes) for name, axes in self.rules))

    def problems(self) -> list[str]:
        out = _mesh_problems(self.mesh_shape)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            out.append(f"trainer.seed must be an integer, got {self.seed!r}")
        if self.peak_flops_per_device is not None:
            finite_rate(out, "trainer.peak_flops_per_device", self.peak_flops_per_device)
        positive_int(out, "trainer.num_microbatches", self.num_microbatches)
        positive_int(out, "trainer.log_every", self.log_every)
        positive_int(out, "trainer.eval_every", self.eval_every, zero=True)
        if self.prng_impl not in PRNG_IMPLS:
            out.append(
                f"trainer.prng_impl must be one of {', '.join(map(repr, PRNG_IMPLS))}, "
                f"got {self.prng_impl!r}"
            )
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig(Group):
    """Where the run lives (local or gs://: checkpoints, run.json, metrics) and its checkpoints:
    one every `every` steps (and at the end), the newest `keep` kept; `nice` is the checkpoint
    threads' priority (None: `checkpointing.default_checkpoint_nice()`)."""

    model_dir: str
    every: int = 1000
    keep: int = 3
    nice: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "model_dir", str(self.model_dir))

    def problems(self) -> list[str]:
        out: list[str] = []
        if not self.model_dir:
            out.append("checkpointing.model_dir must name a directory, got ''")
        else:
            try:
                checkpointing.run_directory(self.model_dir, flag="checkpointing.model_dir")
            except ValueError as error:  # an existing regular file
                out.append(str(error))
        positive_int(out, "checkpointing.every", self.every)
        positive_int(out, "checkpointing.keep", self.keep)
        nice_value(out, "checkpointing.nice", self.nice)
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig(Group):
    """A whole run (see the module docstring). `recipe` may be given by name.

    `operative_config` is the text of the configuration it was built from, if any (gin's
    operative config); `lmsuite.train` writes it beside run.json as config.gin. It is a record,
    not a setting: equality ignores it.
    """

    data: DataConfig
    model: ModelConfig
    recipe: recipes.RecipeChoice
    optimizer: OptimizerConfig
    trainer: TrainerConfig
    checkpointing: CheckpointConfig
    operative_config: str | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if isinstance(self.recipe, str):
            object.__setattr__(self, "recipe", recipes.make_recipe(name=self.recipe))
        expected = {
            "data": DataConfig,
            "model": ModelConfig,
            "recipe": recipes.RecipeChoice,
            "optimizer": OptimizerConfig,
            "trainer": TrainerConfig,
            "checkpointing": CheckpointConfig,
        }
        for name, cls in expected.items():
            value = getattr(self, name)
            if not isinstance(value, cls):
                raise TypeError(
                    f"TrainConfig.{name} must be a {cls.__name__}, got {type(value).__name__} "
                    f"({value!r})"
                )

    def check(self, *, devices: int | None = None, need_data: bool = True) -> preflight.Findings:
        """Every problem and warning of the run (module docstring); `devices` and `need_data`
        as `preflight.check_run` takes them (`lmsuite compile` checks for another slice)."""
        problems = [
            *self.data.problems(),
            *self.trainer.problems(),
            *self.checkpointing.problems(),
        ]
        rate, steps = self.optimizer.learning_rate, self.trainer.train_steps
        if isinstance(rate, ScheduleConfig) and rate.total_steps is None and is_count(steps):
            try:  # the schedule spans the run: its checks need train_steps
                rate.build(train_steps=steps)
            except ValueError as error:
                problems.append(f"optimizer.learning_rate over trainer.train_steps: {error}")
        elif isinstance(rate, ScheduleConfig) and rate.total_steps != steps:
            # (the same value as train_steps, TRAIN_STEPS in the gin files: named once, below)
            positive_int(problems, "make_schedule.total_steps", rate.total_steps)
        for module in self.data.task_modules:
            try:
                importlib.import_module(module)
            except Exception as error:  # the user's module: any failure is a config problem
                problems.append(
                    f"data.task_modules: {module!r} does not import: {type(error).__name__}: "
                    f"{error}"
                )
        problems += self.data.stage_problems(recipe=self.recipe.recipe, train_steps=steps)
        problems += self._eval_split_problems()
        found = preflight.check_run(
            task=self.data.task,
            recipe=self.recipe.recipe,
            sequence_length=self.data.sequence_length,
            model_config=self.model,
            # a mesh that is not three sizes is named above; the batch cannot be checked on it
            batch_size=None if _mesh_problems(self.trainer.mesh_shape) else self.data.batch_size,
            mesh_shape=self.trainer.mesh_shape,
            num_microbatches=self.trainer.num_microbatches,
            train_steps=self.trainer.train_steps,
            devices=devices,
            need_data=need_data,
        )
        found.problems[:0] = problems
        return found

    def _eval_split_problems(self) -> list[str]:
        """data.eval_split, when evaluation runs, must be a split of the task."""
        import seqio

        if not (self.trainer.final_eval or self.trainer.eval_every):
            return []
        try:
            provider = seqio.get_mixture_or_task(self.data.task)
        except ValueError:  # an unknown task: the preflight names it
            return []
        splits = list(provider.splits)
        if splits and self.data.eval_split not in splits:
            return [
                f"data.eval_split (train.eval_split) must be a split of task "
                f"{self.data.task!r}, one of {splits}, got {self.data.eval_split!r}"
            ]
        return []

    def validate(self) -> preflight.Findings:
        """Checks the run once (`check`); returns its warnings' findings.

        Raises:
          InvalidRunError: every problem at once, each naming the value and what was expected.
        """
        found = self.__dict__.get("_validated")
        if found is None:  # frozen: a config that passed stays valid
            found = self.check()
            if found.problems:
                raise InvalidRunError(found.problems, found.warnings)
            self.__dict__["_validated"] = found
        return found

    def built(self) -> recipes.Built:
        """The run's recipe made concrete for its model and task: a mixture's task ids and
        per-task metrics and weights included, as the train step has them (a build without the
        mixture's tasks refuses the run's `task_weights`)."""
        return recipes.build(
            self.recipe, model_config=self.model, tasks=mixtures.task_names(self.data.task)
        )

    def run_record(self) -> dict[str, Any]:
        """What run.json holds: what `lmsuite.load` rebuilds the model and its task from, without
        gin (`lmsuite.evaluation.run_config` reads it)."""
        from lmsuite.data import text_files

        record: dict[str, Any] = {
            "model_config": self.model.to_json(),
            "task": self.data.task,
            "sequence_length": dict(self.data.sequence_length),
            "recipe": self.recipe.recipe.name,
            # How the row was set: `lmsuite eval` rebuilds the run's own loss from it.
            "recipe_options": self.recipe.to_json(),
            # The global batch: a resume compares it (`resume_checks`; run.json files written
            # before it was recorded leave it unknown).
            "batch_size": self.data.batch_size,
            # What registers the task again, so `lmsuite eval` and `lmsuite.load` need no flags.
            "task_modules": list(self.data.task_modules),
        }
        if self.data.shuffle_buffer_size is not None:  # the batches depend on it: a resume compares
            record["shuffle_buffer_size"] = self.data.shuffle_buffer_size
        if self.data.stages:  # a record: evaluation reads the whole mixture
            record["stages"] = [stage.to_json() for stage in self.data.stages]
        if self.data.task in text_files.TEXT_TASKS:  # `--train_files`: the user's own text
            record["text_task"] = text_files.TEXT_TASKS[self.data.task].to_json()
        return record
