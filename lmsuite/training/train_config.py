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
"""

import dataclasses
import importlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import optax

from lmsuite import partitioning
from lmsuite.data import mixtures
from lmsuite.data import stages as stages_lib
from lmsuite.models import ModelConfig
from lmsuite.training import (
    checkpointing,
    input_pipeline,
    optimizers,
    preflight,
    recipes,
    schedules,
)

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


def _positive(problems: list[str], where: str, value: Any, *, zero: bool = False) -> None:
    """Adds a problem unless `value` is an int >= 1 (>= 0 with `zero`)."""
    least = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        problems.append(f"{where} must be an integer >= {least}, got {value!r}")


def _is_count(value: Any, least: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _rate(problems: list[str], where: str, value: Any, *, zero: bool = False) -> None:
    """Adds a problem unless `value` is a finite number > 0 (>= 0 with `zero`)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        least = ">= 0" if zero else "> 0"
        problems.append(f"{where} must be a finite number {least}, got {value!r}")


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


class _Group:
    def replace(self, **changes):
        """A copy with `changes` (dataclasses.replace)."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleConfig(_Group):
    """A learning-rate schedule (`schedules.make_schedule`); `total_steps=None` means the run's
    `trainer.train_steps`. Its settings are checked when it is made."""

    name: str = "linear"
    peak_value: float
    warmup_steps: int = 0
    total_steps: int | None = None
    end_value: float = 0.0
    tf_bert_jump: bool = False

    def __post_init__(self):
        if self.name not in schedules.SCHEDULES:
            raise ValueError(
                f"schedule name must be one of {schedules.SCHEDULES}, got {self.name!r}"
            )
        problems = self.problems()
        if problems:  # made with a bad value: nothing downstream should see it
            raise ValueError("; ".join(problems))
        if _is_count(self.total_steps):  # (not an integer: TrainConfig.check names it once)
            self.build(train_steps=self.total_steps)  # the schedule's own checks

    def problems(self) -> list[str]:
        """Its values: a finite positive peak rate (LEARNING_RATE), whole warmup steps."""
        out: list[str] = []
        _rate(out, "the learning rate (make_schedule.peak_value, LEARNING_RATE)", self.peak_value)
        _rate(out, "make_schedule.end_value", self.end_value, zero=True)
        _positive(out, "make_schedule.warmup_steps (WARMUP_STEPS)", self.warmup_steps, zero=True)
        return out

    def build(self, *, train_steps: int) -> optax.Schedule:
        total = train_steps if self.total_steps is None else self.total_steps
        return schedules.make_schedule(
            name=self.name,
            peak_value=self.peak_value,
            warmup_steps=self.warmup_steps,
            total_steps=total,
            end_value=self.end_value,
            tf_bert_jump=self.tf_bert_jump,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig(_Group):
    """An optimizer (`optimizers.make_optimizer`'s settings): a constant `learning_rate` or a
    `ScheduleConfig`, which is also the rate the step logs."""

    name: str = "adamw"
    learning_rate: ScheduleConfig | float
    clip_norm: float | None = 1.0
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    bias_correction: bool | None = None

    def __post_init__(self):
        if self.name not in optimizers.OPTIMIZERS:
            raise ValueError(
                f"optimizer name must be one of {optimizers.OPTIMIZERS}, got {self.name!r}"
            )
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be positive or None, got {self.clip_norm}")
        problems: list[str] = []
        if not isinstance(self.learning_rate, ScheduleConfig):  # (a schedule checks its own)
            # a negative rate would train by gradient ascent
            _rate(problems, "optimizer.learning_rate (or a ScheduleConfig)", self.learning_rate)
        _rate(problems, "make_optimizer.weight_decay (WEIGHT_DECAY)", self.weight_decay, zero=True)
        _rate(problems, "make_optimizer.eps", self.eps, zero=True)
        if problems:
            raise ValueError("; ".join(problems))

    def build(self, *, train_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
        """(the optimizer, its learning-rate schedule)."""
        rate = self.learning_rate
        if isinstance(rate, ScheduleConfig):
            rate = schedule = rate.build(train_steps=train_steps)
        else:
            schedule = optax.constant_schedule(rate)
        tx = optimizers.make_optimizer(
            name=self.name,
            learning_rate=rate,
            clip_norm=self.clip_norm,
            weight_decay=self.weight_decay,
            b1=self.b1,
            b2=self.b2,
            eps=self.eps,
            bias_correction=self.bias_correction,
        )
        return tx, schedule


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig(_Group):
    """What the run reads: the SeqIO task or mixture, its feature lengths, the global batch,
    the held-out batches evaluation reads, and the input pipeline's threads.

    `task_modules` are imported before the task is looked up (modules that register it) and
    recorded in run.json, so `lmsuite.load` registers the task again. `input_sharding` is
    `input_pipeline.process_dataset`'s ("replicated": batches independent of the host count).
    `stages` is a continual schedule over mixture `task` (`lmsuite.data.stages`: `Stage`s or
    (first step, {task: rate}) pairs); empty: the mixture's own rates throughout.
    `data_change` lets a resume change the batch size, task or lengths of the run it resumes
    (`DATA_CHANGES`; None: such a resume is refused, `lmsuite.training.resume_checks`).
    """

    task: str
    sequence_length: Mapping[str, int]
    batch_size: int
    eval_split: str = input_pipeline.EVAL_SPLIT
    eval_batches: int = input_pipeline.EVAL_BATCHES
    input_threads: int | None = None
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
                _positive(out, f"data.sequence_length[{key!r}]", length)
        _positive(out, "data.batch_size", self.batch_size)
        _positive(out, "data.eval_batches", self.eval_batches)
        if self.input_threads is not None:
            _positive(out, "data.input_threads", self.input_threads)
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
class TrainerConfig(_Group):
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
            _rate(out, "trainer.peak_flops_per_device", self.peak_flops_per_device)
        _positive(out, "trainer.num_microbatches", self.num_microbatches)
        _positive(out, "trainer.log_every", self.log_every)
        _positive(out, "trainer.eval_every", self.eval_every, zero=True)
        if self.prng_impl not in PRNG_IMPLS:
            out.append(
                f"trainer.prng_impl must be one of {', '.join(map(repr, PRNG_IMPLS))}, "
                f"got {self.prng_impl!r}"
            )
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig(_Group):
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
        _positive(out, "checkpointing.every", self.every)
        _positive(out, "checkpointing.keep", self.keep)
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig(_Group):
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
        if isinstance(rate, ScheduleConfig) and rate.total_steps is None and _is_count(steps):
            try:  # the schedule spans the run: its checks need train_steps
                rate.build(train_steps=steps)
            except ValueError as error:
                problems.append(f"optimizer.learning_rate over trainer.train_steps: {error}")
        elif isinstance(rate, ScheduleConfig) and rate.total_steps != steps:
            # (the same value as train_steps, TRAIN_STEPS in the gin files: named once, below)
            _positive(problems, "make_schedule.total_steps", rate.total_steps)
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

    def run_record(self) -> dict[str, Any]:
        """What run.json holds: what `lmsuite.load` rebuilds the model and its task from, without
        gin (`lmsuite.evaluation.run_config` reads it)."""
        from lmsuite.data import text_files

        record: dict[str, Any] = {
            "model_config": self.model.to_json(),
            "task": self.data.task,
            "sequence_length": dict(self.data.sequence_length),
            "recipe": self.recipe.recipe.name,
            # The global batch: a resume compares it (`resume_checks`; run.json files written
            # before it was recorded leave it unknown).
            "batch_size": self.data.batch_size,
            # What registers the task again, so `lmsuite eval` and `lmsuite.load` need no flags.
            "task_modules": list(self.data.task_modules),
        }
        if self.data.stages:  # a record: evaluation reads the whole mixture
            record["stages"] = [stage.to_json() for stage in self.data.stages]
        if self.data.task in text_files.TEXT_TASKS:  # `--train_files`: the user's own text
            record["text_task"] = text_files.TEXT_TASKS[self.data.task].to_json()
        return record
