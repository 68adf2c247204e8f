"""`evaluate(model_dir=D, task=T)`: held-out metrics of a run's checkpoint, written next to it.

Two paths, chosen by what the task's examples are:

  targets to score   (seq2seq, causal and prefix LM rows: a "targets" feature and the
                     converter's decoder_target_tokens) go through `seqio.Evaluator`: the run's
                     task is copied with lmsuite's score metrics added to its own metric_fns
                     (predict metrics are decoded greedily on encoder-decoders), and a score_fn
                     returns each example's summed cross-entropy, token count, correct tokens
                     and whether every target was right;
  gathered masks     (MLM rows: `masked_ids` at `masked_positions`, no "targets") cannot be
                     expressed on the Evaluator's score path, whose metrics decode a "targets"
                     feature: they go through the recipe's feature converter, the batches the
                     run's own evaluation reads (`input_pipeline.eval_dataset`) and
                     `step.eval_step`.

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
import functools
import json
import math
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import seqio

from lmsuite.data import mixtures
from lmsuite.evaluation import run_config
from lmsuite.evaluation.load import committed_steps, load_run
from lmsuite.models import ModelConfig, Transformer, families, memory_shapes
from lmsuite.training import input_pipeline, recipes, step

EVAL_DIR = "eval"
DEFAULT_BATCH_SIZE = 8
STATS = ("cross_entropy", "tokens", "correct", "all_correct")  # a score_fn row, per example


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


class LabelCount(NamedTuple):
    """A classification head's held-out labels: its accuracy metric, the labelled entries (rows,
    or tokens for a per-token head) and the share of the most frequent label among them."""

    metric: str
    labelled: int
    majority: float
    per_token: bool


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
        metrics, count = _with_evaluator(req, built)
        path = "seqio.Evaluator"
    else:
        metrics, count, labels = _with_eval_step(req, built)
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


def summarize(stats: np.ndarray, *, sequences: bool) -> dict[str, float]:
    """Metrics from per-example rows of `STATS`: token-weighted loss and accuracy, perplexity.

    Example: rows [[2.0, 2, 1, 0], [1.0, 2, 2, 1]] -> loss 0.75, token_accuracy 0.75,
    perplexity exp(0.75), sequence_accuracy 0.5.
    """
    stats = np.asarray(stats, np.float64).reshape(-1, len(STATS))
    tokens = stats[:, 1].sum()
    if tokens == 0:
        raise ValueError(f"no target tokens to evaluate in {len(stats)} examples")
    loss = stats[:, 0].sum() / tokens
    out = {"loss": loss, "token_accuracy": stats[:, 2].sum() / tokens, "perplexity": math.exp(loss)}
    if sequences:
        out["sequence_accuracy"] = stats[:, 3].mean()
    return {k: float(v) for k, v in out.items()}


# ------------------------------------------------------------------------ seqio.Evaluator
def _score_metrics(*, sequences: bool):
    def lmsuite_metrics(targets, scores):  # seqio's score-metric signature
        del targets
        return summarize(scores, sequences=sequences)

    return lmsuite_metrics


def example_stats(logits_BLV, targets_BL, weights_BL) -> jax.Array:
    """Per-example `STATS` rows, (B, 4), of the weighted target positions."""
    logp_BLV = jax.nn.log_softmax(logits_BLV.astype(jnp.float32), axis=-1)
    ce_BL = -jnp.take_along_axis(logp_BLV, targets_BL[..., None], axis=-1)[..., 0]
    w_BL = (weights_BL > 0).astype(jnp.float32)
    right_BL = (jnp.argmax(logits_BLV, axis=-1) == targets_BL).astype(jnp.float32) * w_BL
    tokens_B = w_BL.sum(-1)
    return jnp.stack(
        [(ce_BL * w_BL).sum(-1), tokens_B, right_BL.sum(-1), (right_BL.sum(-1) == tokens_B) * 1.0],
        axis=-1,
    )


def _batches(dataset, batch_size: int):
    """(indices, padded numpy batch, real rows) of an enumerated dataset, batch_size rows each:
    the last batch is padded with zero rows, so one shape compiles."""
    for indices, batch in dataset.batch(batch_size).as_numpy_iterator():
        n = len(indices)
        if n < batch_size:
            batch = {
                k: np.concatenate([v, np.zeros((batch_size - n, *v.shape[1:]), v.dtype)])
                for k, v in batch.items()
            }
        yield indices, batch, n


def _with_evaluator(req: EvalRequest, built: recipes.Built) -> tuple[dict[str, float], int]:
    task = seqio.get_mixture_or_task(req.task)
    if not isinstance(task, seqio.Task):
        raise ValueError(f"{req.task!r} is a mixture; evaluate one of its tasks")
    sequences = families.family(req.model_config).seq2seq
    name = f"{req.task}.lmsuite_eval"
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add_provider(
        name,
        seqio.Task(
            name,
            source=task.source,
            output_features=task.output_features,
            preprocessors=task.preprocessors,
            postprocess_fn=task.postprocessor,
            metric_fns=[_score_metrics(sequences=sequences), *task.metric_fns],
        ),
    )
    try:
        evaluator = seqio.Evaluator(
            name,
            feature_converter=req.recipe.converter(pack=False),  # the Evaluator cannot pack
            eval_split=req.split,
            sequence_length=dict(req.sequence_length),
            num_examples=None if req.max_batches is None else req.max_batches * req.batch_size,
            seed=0,  # as the run's evaluation (`input_pipeline.process_dataset`)
            async_compute_metrics=False,
        )
        model = Transformer(req.model_config)
        objective = built.objective

        @jax.jit
        def stats(params, batch):
            outputs = model.apply(
                {"params": params}, **objective.model_inputs(batch), deterministic=True
            )
            return example_stats(
                outputs["lm_logits"], batch["decoder_target_tokens"], batch["decoder_loss_weights"]
            )

        def score_fn(dataset, model_feature_shapes=None):
            rows = []
            for indices, batch, n in _batches(dataset, req.batch_size):
                out = np.asarray(stats(req.params, batch))[:n]
                rows += list(zip(indices.tolist(), out, strict=True))
            return rows

        future, _ = evaluator.evaluate(
            compute_metrics=True,
            step=req.step,
            score_fn=score_fn,
            predict_fn=functools.partial(_greedy_predict, req) if sequences else None,
        )
        metrics = future.result()[name]
        count = sum(1 for _ in evaluator.cached_task_datasets[name])
        evaluator.close()
    finally:
        seqio.TaskRegistry.remove(name)
    return {k: _scalar(v) for k, v in metrics.items()}, count


def _greedy_predict(req: EvalRequest, dataset, model_feature_shapes=None):
    """(index, tokens) of greedy decoding, for a task's own predict metric_fns (seq2seq)."""
    from lmsuite.evaluation import decoding

    # The targets' own EOS (lmsuite's vocabulary: `</s>` is 6; seqio's default of 1 is [UNK]).
    eos = seqio.get_mixture_or_task(req.task).output_features["targets"].vocabulary.eos_id
    rows = []
    for indices, batch, n in _batches(dataset, req.batch_size):
        inputs = batch["encoder_input_tokens"]
        out = decoding.generate(
            req.model_config,
            req.params,
            input_ids=inputs,
            attention_mask=(inputs != req.model_config.pad_id).astype(np.int32),
            max_new_tokens=batch["decoder_target_tokens"].shape[1],
            pad_token_id=req.model_config.pad_id,
            decoder_start_token_id=req.model_config.decoder_start_id,
            eos_token_id=eos,
        )
        rows += [
            (i, [int(t) for t in row]) for i, row in zip(indices.tolist(), out[:n], strict=True)
        ]
    return rows


def _scalar(value) -> float:
    value = getattr(value, "value", value)  # seqio.metrics.Scalar
    return float(value)


# ---------------------------------------------------------------------------- eval_step
class _Params(NamedTuple):
    params: Any  # what `step.eval_step` reads of a TrainState


def _with_eval_step(
    req: EvalRequest, built: recipes.Built
) -> tuple[dict[str, float], int, dict[str, LabelCount]]:
    """(metrics, examples, label feature -> its `LabelCount`).

    A multi-task row's examples carry every label head's feature, -1 where their task has no
    such label (`label_fill`, as in training): a head's loss and accuracy are averaged over its
    labelled entries, and a head no example labels is left out, so one task of an ERNIE 2.0 run
    reports its own head only. A mixture reports per-task metrics, as its run does."""
    label_heads = dict(built.objective.label_heads)
    data = input_pipeline.eval_dataset(
        task=req.task,
        sequence_length=req.sequence_length,
        feature_converter=built.feature_converter,
        global_batch_size=req.batch_size,
        split=req.split,
        batches=-1 if req.max_batches is None else req.max_batches,  # -1: tf.data's "all"
        rows_task=req.recipe.rows_task,
        task_ids_along=built.task_ids_along,
        label_fill=label_heads or None,
    )
    model = Transformer(req.model_config)
    objective = built.objective
    targets, weights = objective.prediction_features
    accuracy, cross_entropy = objective.learning_metrics

    @jax.jit
    def run(params, batch, carry):
        return step.eval_step(
            _Params(params), batch, carry, apply_fn=model.apply, objective=objective
        )

    carry = None
    if objective.carry is not None:
        shapes = memory_shapes(req.model_config, req.batch_size)
        carry = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    heads = {f"{name}_{m}": name for name in label_heads for m in ("loss", "accuracy")}
    tallies = {
        label: _LabelTally(metric, label, label_heads.get(label, False))
        for metric, label in objective.label_metrics
    }
    tokens = batches = 0

    def parts():
        nonlocal carry, tokens, batches
        for batch in data.as_numpy_iterator():
            batch_parts, carry = run(req.params, batch, carry)
            tokens += int((np.asarray(batch[weights]) > 0).sum())
            batches += 1
            for tally in tallies.values():
                tally.add(batch)
            yield batch_parts

    held_out = step.held_out_metrics(objective, parts())
    if not tokens:
        raise ValueError(
            f"task {req.task!r} split {req.split!r} gave no batch of {req.batch_size} examples "
            f"with {targets!r} to evaluate"
        )
    loss = held_out[cross_entropy]  # per target token, as every metric: over all the batches
    out = {"loss": loss, "token_accuracy": held_out[accuracy], "perplexity": math.exp(loss)}
    out |= {
        f"eval/{k}": v
        for k, v in held_out.items()
        if k not in heads or tallies[heads[k]].labelled  # a head no example labels: left out
    }
    labels = {label: t.count() for label, t in tallies.items() if t.labelled}
    return out, batches * req.batch_size, labels


class _LabelTally:
    """Counts one label feature's labelled entries and classes over the batches (-1: none; a
    per-token label counts the real tokens only, as the head's loss does)."""

    def __init__(self, metric: str, label: str, per_token: bool):
        self.metric, self.label, self.per_token = metric, label, per_token
        self.classes = np.zeros(0, np.int64)

    @property
    def labelled(self) -> int:
        return int(self.classes.sum())

    def add(self, batch) -> int:
        values = np.asarray(batch[self.label]).reshape(len(batch["input_mask"]), -1)
        present = values >= 0
        if self.per_token:
            present &= np.asarray(batch["input_mask"]) > 0
        found = np.bincount(values[present])
        size = max(len(found), len(self.classes))
        self.classes = np.pad(self.classes, (0, size - len(self.classes)))
        self.classes += np.pad(found, (0, size - len(found)))
        return int(present.sum())

    def count(self) -> LabelCount:
        share = float(self.classes.max() / self.labelled)
        return LabelCount(self.metric, self.labelled, share, self.per_token)


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
