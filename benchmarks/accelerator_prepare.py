"""The half of `benchmarks/accelerator_step.py` that needs lmsuite's data stack: each
experiment's variants loaded from its gin file as `lmsuite train` loads them, the one batch they
share, and the pickled form that `--prepare` writes and `--setup` reads on an accelerator image
without TensorFlow. Only the loaders import the data stack, inside the functions: the classes
and `load_prepared` must import where it is absent.
"""

import dataclasses
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lmsuite.models import ModelConfig
from lmsuite.objectives import Objective
from lmsuite.training.optimizer_config import OptimizerConfig

VARIANTS = {
    "baseline": {
        "ModelConfig.dtype": "'float32'",
        "ModelConfig.attention_impl": "'plain'",
        "train.prng_impl": "'threefry2x32'",
    },
    "fast": {
        "ModelConfig.dtype": "'bfloat16'",
        "ModelConfig.attention_impl": "'fused'",
        "train.prng_impl": "'rbg'",
    },
}
# `--ablate`: the steps from baseline to fast one change at a time, measured between them (the
# attention dropout the fast variant drops, then bf16, then fused attention; fast adds rbg).
ABLATION = {
    "no_attn_dropout": {**VARIANTS["baseline"]},
    "bf16": {**VARIANTS["baseline"], "ModelConfig.dtype": "'bfloat16'"},
    "bf16_fused": {**VARIANTS["fast"], "train.prng_impl": "'threefry2x32'"},
}
TRAINER_FIELDS = ("seed", "rules", "num_microbatches", "skip_nonfinite", "prng_impl", "train_steps")


@dataclasses.dataclass
class Variant:
    """What `measure` needs of one variant of an experiment, holding nothing of the data stack:
    it pickles, so `--prepare` (on a host where lmsuite installs whole) and `--setup` (on an
    accelerator image without TensorFlow) can split the work. `loss(**loss_options)` is the
    objective (`recipes.loss_call`); `trainer` holds `TRAINER_FIELDS` of the run's
    `TrainerConfig`."""

    name: str
    bindings: dict[str, str]
    model: ModelConfig
    loss: Callable[..., Objective]
    loss_options: dict[str, Any]
    optimizer: OptimizerConfig
    trainer: dict[str, Any]
    sequence_length: dict[str, int]


@dataclasses.dataclass
class Prepared:
    """Both variants of one experiment and the one batch they share (the largest measured;
    `measure_experiment` halves it by rows when a variant runs out of memory)."""

    experiment: str
    variants: list[Variant]
    notes: list[str]
    batch: dict[str, np.ndarray]
    shapes_task: str
    # XLA's count of the baseline step over the whole prepared batch, lowered where it was
    # prepared: a GPU backend counts no lowered step, and its compiled count leaves out every
    # GEMM it hands to cuBLAS (t5_1_1_base: 0.28 of about 27 TFLOP).
    host_flops: float | None = None


def load_run(experiment: str, bindings: dict[str, str]):
    """The experiment's checked `TrainConfig`, as `lmsuite train --gin.KEY=VALUE ...` loads it
    (its data need not be prepared: only its shapes are used)."""
    from lmsuite import cli

    flags = [f"--gin.{key}={value}" for key, value in bindings.items()]
    args = cli.parse_args(
        ["train", f"--gin_file=experiments/{experiment}.gin", "--model_dir=/unused", *flags]
    )
    return cli.load_run(args, need_data=False)


def fast_bindings(experiment: str, baseline) -> tuple[dict[str, str], list[str]]:
    """(gin bindings, deviations from the experiment to print) of the fast variant, given the
    experiment's baseline run."""
    bindings = dict(VARIANTS["fast"])
    notes = []
    rate = baseline.model.attention_dropout_rate
    if rate > 0:
        bindings["ModelConfig.attention_dropout_rate"] = "0.0"
        notes.append(
            f"{experiment}: attention_dropout_rate 0.0 instead of the experiment's {rate} so "
            "that attention can fuse (the baseline keeps it)"
        )
    return bindings, notes


def read_batch(run, batch_size: int):
    """(one batch of `batch_size` rows as numpy, the task it was read from), through `run`'s
    recipe (the baseline's: both variants read the same data)."""
    from lmsuite.training import aot, input_pipeline, recipes

    built = recipes.build(run.recipe, model_config=run.model)
    source = aot.shapes_task(run.data.task)
    dataset = input_pipeline.process_dataset(
        task=source,
        sequence_length=run.data.sequence_length,
        feature_converter=built.feature_converter,
        global_batch_size=batch_size,
        shuffle=False,
    )
    return next(dataset.as_numpy_iterator()), source


def prepare_experiment(
    experiment: str, *, batch_size: int | None, ablate: bool = False
) -> Prepared:
    """Loads the variants of `experiment` (baseline, with `ablate` the `ABLATION` steps, fast) and
    reads their batch (`batch_size` rows, or the experiment's): the part that needs the data
    stack."""
    from lmsuite.training import recipes

    bindings = {"baseline": dict(VARIANTS["baseline"])}
    runs = {"baseline": load_run(experiment, bindings["baseline"])}
    fast, notes = fast_bindings(experiment, runs["baseline"])
    dropout = {k: v for k, v in fast.items() if k == "ModelConfig.attention_dropout_rate"}
    for name, step_bindings in ABLATION.items() if ablate else ():
        if name == "no_attn_dropout" and not dropout:
            continue  # the experiment has no attention dropout: the baseline already is this
        bindings[name] = {**step_bindings, **dropout}
        runs[name] = load_run(experiment, bindings[name])
    bindings["fast"] = fast
    runs["fast"] = load_run(experiment, fast)
    variants = []
    for name, run in runs.items():
        loss, options = recipes.loss_call(run.recipe, model_config=run.model)
        variants.append(
            Variant(
                name=name,
                bindings=bindings[name],
                model=run.model,
                loss=loss,
                loss_options=options,
                optimizer=run.optimizer,
                trainer={field: getattr(run.trainer, field) for field in TRAINER_FIELDS},
                sequence_length=dict(run.data.sequence_length),
            )
        )
    batch, source = read_batch(runs["baseline"], batch_size or runs["baseline"].data.batch_size)
    return Prepared(
        experiment=experiment, variants=variants, notes=notes, batch=batch, shapes_task=source
    )


def select_variants(prepared: Prepared, names: list[str]) -> list[Variant]:
    """`prepared`'s variants named in `names`, in their own order.

    Raises:
      ValueError: a name it does not hold, listing those it does.
    """
    held = [variant.name for variant in prepared.variants]
    unknown = [name for name in names if name not in held]
    if unknown or not names:
        raise ValueError(
            f"--variants={','.join(names)}: {prepared.experiment} has variants {held} (prepare "
            f"with --ablate for {', '.join(ABLATION)})"
        )
    return [variant for variant in prepared.variants if variant.name in names]


def prepared_path(folder: str, experiment: str) -> Path:
    return Path(folder) / f"{experiment}.pkl"


def load_prepared(folder: str, experiment: str) -> Prepared:
    """The `Prepared` that `--prepare=folder` wrote for `experiment`.

    Raises:
      FileNotFoundError: none was written, naming the command that writes it.
    """
    path = prepared_path(folder, experiment)
    if not path.exists():
        raise FileNotFoundError(
            f"no prepared experiment {experiment!r} at {path}: write it where lmsuite installs "
            f"whole with `python benchmarks/accelerator_step.py --experiments={experiment} "
            f"--prepare={folder}` (with the same --dry_run and --batch_size)"
        )
    with path.open("rb") as file:
        fields = pickle.load(file)
    if not isinstance(fields, dict) or fields.get("experiment") != experiment:
        raise ValueError(f"{path} does not hold experiment {experiment!r}'s prepared variants")
    fields["variants"] = [Variant(**variant) for variant in fields["variants"]]
    return Prepared(**fields)


def save_prepared(folder: str, prepared: Prepared) -> Path:
    """Writes `prepared` for `load_prepared` as plain dicts (this script's classes are
    `__main__`'s when it runs as a script, so they do not pickle by name)."""
    path = prepared_path(folder, prepared.experiment)
    shallow = lambda obj: {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # noqa: E731
    fields = shallow(prepared)
    fields["variants"] = [shallow(variant) for variant in prepared.variants]
    with path.open("wb") as file:
        pickle.dump(fields, file)
    return path
