"""The Evaluator path of `lmsuite eval`: rows whose examples have targets to score.

Seq2seq, causal and prefix LM rows (a "targets" feature and the converter's
decoder_target_tokens) are scored by `seqio.Evaluator`: the run's task is copied with lmsuite's
score metrics added to its own metric_fns, and a score_fn returns each example's `STATS` row
(summed cross-entropy, token count, correct tokens, whether every target was right). The task's
predict metrics read greedy decodes on encoder-decoders.
"""

import functools
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
import seqio

from lmsuite.models import Transformer, families
from lmsuite.training import recipes

if TYPE_CHECKING:
    from lmsuite.evaluation.evaluate import EvalRequest

STATS = ("cross_entropy", "tokens", "correct", "all_correct")  # a score_fn row, per example


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


def with_evaluator(req: "EvalRequest", built: recipes.Built) -> tuple[dict[str, float], int]:
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
            predict_fn=functools.partial(greedy_predict, req) if sequences else None,
        )
        metrics = future.result()[name]
        count = sum(1 for _ in evaluator.cached_task_datasets[name])
        evaluator.close()
    finally:
        seqio.TaskRegistry.remove(name)
    return {k: _scalar(v) for k, v in metrics.items()}, count


def greedy_predict(req: "EvalRequest", dataset, model_feature_shapes=None):
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
