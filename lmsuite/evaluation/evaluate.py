"""`evaluate(model_dir=D, task=T)`: held-out metrics of a run's checkpoint, written next to it.

Two paths, chosen by what the task's examples are:

  targets to score   (seq2seq, causal and prefix LM rows: a "targets" feature and the
                     converter's decoder_target_tokens) go through `seqio.Evaluator`: the run's
                     task is copied with lmsuite's score metrics added to its own metric_fns
                     (predict metrics are decoded greedily on encoder-decoders), and a score_fn
                     returns each example's summed cross-entropy, token count, correct tokens
                     and whether every target was right (`seqio_scores`);
  gathered masks     (MLM rows: `masked_ids` at `masked_positions`, no "targets") cannot be
                     expressed on the Evaluator's score path, whose metrics decode a "targets"
                     feature: they go through the recipe's feature converter, the batches the
                     run's own evaluation reads (`input_pipeline.eval_dataset`) and
                     `step.eval_step` (`step_scores`).

Either way the metrics are `loss` (mean cross-entropy per target token), `token_accuracy`,
`perplexity` (exp(loss)) and, for seq2seq, `sequence_accuracy`; the eval_step path adds the
recipe's own metrics as `eval/<name>`, as training's evaluation logs them (each over all the
batches together: `step.held_out_metrics`), with the run's own packing, loss options and task
weights (run.json's `recipe_options`; one task of a mixture is scored unweighed).
They go to TensorBoard under D/eval/<task>/ at the checkpoint's step and to
D/eval/<task>_<split>_step<N>.json.

  >>> result = evaluate(model_dir="runs/smoke", max_batches=2)
  >>> result.metrics["loss"], result.num_examples, result.json_path
"""

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import seqio

from lmsuite.data import mixtures
from lmsuite.evaluation import run_config, seqio_scores, step_scores
from lmsuite.evaluation.load import committed_steps, load_run
from lmsuite.evaluation.step_scores import LabelCount
from lmsuite.models import ModelConfig
from lmsuite.training import input_pipeline, recipes

EVAL_DIR = "eval"
DEFAULT_BATCH_SIZE = 8


@dataclasses.dataclass(frozen=True)
class EvalRequest:
    """What to evaluate, resolved and checked against the run (`resolve`)."""

    model_dir: str
    task: str
    split: str
    step: int
    recipe: recipes.Recipe
    sequence_length: Mapping[str, int]
    model_config: ModelConfig
    params: Any
    batch_size: int
    max_batches: int | None
    # The run's packing, loss options and task weights (run.json's record); None: the row's
    # defaults
    choice: recipes.RecipeChoice | None = None
    # What the figures cannot follow of the run (options run.json could not record), said
    # beside them
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, float]
    step: int
    split: str
    task: str
    num_examples: int
    path: str  # "seqio.Evaluator" or "eval_step"
    json_path: str
    tensorboard_dir: str
    # label feature -> its head's held-out labels (the eval_step path; NSP, SOP, ERNIE 2.0, ...)
    labels: Mapping[str, LabelCount] = dataclasses.field(default_factory=dict)
    # the packing, loss options and task weights the loss was built with
    # (`recipes.RecipeChoice.to_json`), and what they could not follow of the run
    recipe_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()


def resolve(
    *,
    model_dir: str,
    task: str | None = None,
    split: str = input_pipeline.EVAL_SPLIT,
    step: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batches: int | None = None,
    sequence_length: Mapping[str, int] | None = None,
) -> EvalRequest:
    """Checks the request against the run before anything is computed.

    Raises:
      ValueError: no run.json or committed checkpoint, a step that is not committed (listing
        those that are: `lmsuite.load`'s messages), an unknown task (the nearest names), a
        split the task lacks, a non-positive batch size, sequence lengths without the recipe's
        keys.
    """
    from lmsuite.data import tasks  # noqa: F401  (registers the lmsuite tasks)
    from lmsuite.did_you_mean import nearest

    run = run_config.read_run_config(model_dir)
    loaded = load_run(model_dir, step)  # raises the checkpoint and step errors
    step = committed_steps(model_dir)[-1] if step is None else step
    if run.recipe is None:
        raise ValueError(f"{model_dir}/{run_config.RUN_FILE} names no recipe")
    recipe = recipes.get(run.recipe)
    try:
        choice = recipes.choice_from_json(run.recipe, run.recipe_options)
    except ValueError as error:
        raise ValueError(
            f"{model_dir}/{run_config.RUN_FILE} records recipe options this lmsuite cannot set: "
            f"{error}"
        ) from error
    notes = _choice_notes(run.recipe_options)
    task = task or run.task
    known = [*seqio.TaskRegistry.names(), *seqio.MixtureRegistry.names()]
    if task not in known:
        raise ValueError(
            f"unknown task {task!r}{nearest(task, known)} (import the module that registers it;"
            " `lmsuite tasks list` lists the registered ones)"
        )
    if mixtures.is_mixture(task) and uses_evaluator(recipe):
        raise ValueError(
            f"{task!r} is a mixture of {list(mixtures.task_names(task))}; recipe "
            f"{recipe.name!r} is scored by seqio.Evaluator one task at a time: pass one of them "
            "as the task"
        )
    splits = list(seqio.get_mixture_or_task(task).splits)
    if split not in splits:
        raise ValueError(f"task {task!r} has no split {split!r}; it has {splits}")
    if batch_size < 1 or (max_batches is not None and max_batches < 1):
        raise ValueError(f"batch_size={batch_size}, max_batches={max_batches}: expected >= 1")
    lengths = dict(sequence_length or run.sequence_length or {})
    if set(lengths) != set(recipe.length_keys):
        raise ValueError(
            f"sequence_length {lengths} must have the keys of recipe {recipe.name!r}: "
            f"{list(recipe.length_keys)}"
        )
    return EvalRequest(
        model_dir=model_dir,
        task=task,
        split=split,
        step=step,
        recipe=recipe,
        sequence_length=lengths,
        model_config=loaded.config,
        params=loaded.params,
        batch_size=batch_size,
        max_batches=max_batches,
        choice=choice,
        notes=notes,
    )


def _choice_notes(record: Mapping[str, Any] | None) -> tuple[str, ...]:
    if record is None:
        return (
            f"the run's {run_config.RUN_FILE} predates its recipe options: the loss is the "
            "row's with its default options and task weights",
        )
    return tuple(
        f"loss option {key}={shown} is not recorded in {run_config.RUN_FILE} (not JSON): the "
        "loss uses the row's default for it"
        for key, shown in record.get("unrecorded", {}).items()
    )


def evaluate(*, write: bool = True, **request) -> EvalResult:
    """Evaluates `resolve(**request)` and writes the JSON and TensorBoard scalars (`write`)."""
    return evaluate_request(resolve(**request), write=write)


def evaluate_request(req: EvalRequest, *, write: bool = True) -> EvalResult:
    """`evaluate` of a request `resolve` already checked."""
    tasks = mixtures.task_names(req.task) if mixtures.is_mixture(req.task) else ()
    choice = req.choice or recipes.make_recipe(name=req.recipe.name)
    if not tasks:  # one task, maybe of a weighed mixture's run: its own loss, unweighed
        choice = dataclasses.replace(choice, task_weights={})
    built = recipes.build(choice, model_config=req.model_config, tasks=tasks)
    labels = {}
    if uses_evaluator(req.recipe):
        metrics, count = seqio_scores.with_evaluator(req, built)
        path = "seqio.Evaluator"
    else:
        metrics, count, labels = step_scores.with_eval_step(req, built)
        path = "eval_step"
    out_dir = os.path.join(req.model_dir, EVAL_DIR)
    json_path = os.path.join(out_dir, f"{req.task}_{req.split}_step{req.step}.json")
    tensorboard_dir = os.path.join(out_dir, req.task)
    result = EvalResult(
        metrics=metrics,
        step=req.step,
        split=req.split,
        task=req.task,
        num_examples=count,
        path=path,
        json_path=json_path,
        tensorboard_dir=tensorboard_dir,
        labels=labels,
        recipe_options=choice.to_json(),
        notes=req.notes,
    )
    if write:
        _write(result)
    return result


def uses_evaluator(recipe: recipes.Recipe) -> bool:
    """Whether the recipe's examples have "targets" that the Evaluator's score path reads."""
    return "targets" in recipe.task_features and recipe.objective.prediction_features[0] == (
        "decoder_target_tokens"
    )


# -------------------------------------------------------------------------------- write
def _write(result: EvalResult) -> None:
    from clu import metric_writers

    os.makedirs(result.tensorboard_dir, exist_ok=True)
    writer = metric_writers.create_default_writer(result.tensorboard_dir, asynchronous=False)
    writer.write_scalars(result.step, result.metrics)
    writer.flush()
    writer.close()
    record = {
        "task": result.task,
        "split": result.split,
        "step": result.step,
        "num_examples": result.num_examples,
        "path": result.path,
        "metrics": result.metrics,
        "labels": {label: count._asdict() for label, count in result.labels.items()},
        "recipe_options": dict(result.recipe_options),
        "notes": list(result.notes),
    }
    with open(result.json_path, "w") as f:
        f.write(json.dumps(record, indent=1) + "\n")
