"""Encoder-decoder cross-entropy (T5, BART, MASS) over SeqIO's `EncDecFeatureConverter` features,
with T5X's loss options.

Features (B, L) encoder / (B, M) decoder, packed or not:
  encoder_input_tokens, decoder_input_tokens, decoder_target_tokens, decoder_loss_weights
  packed: encoder_segment_ids, encoder_positions, decoder_segment_ids, decoder_positions
  MASS (`MassFeatureConverter`): decoder_positions also unpacked (the fragment's source positions)
Segment ids restrict encoder self-attention, decoder self-attention and cross-attention to one
packed example; positions reach the position embeddings (learned positions, BART and MASS). T5's
relative biases depend on i - j only, which packing does not change inside a segment.

The loss per target token is T5X's `cross_entropy_with_logits` plus its z-loss:
  log Z - sum_v q_v logit_v + z_loss * (log Z)^2 - c
with q the label-smoothed target distribution (1 - s on the target, s / (V - 1) elsewhere) and c
the entropy of q, so a perfect prediction scores 0 with smoothing too.
"""

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from lmsuite.objectives.base import MetricSum, Objective, TermSums, require, total_weight

INPUTS, DECODER_INPUTS = "encoder_input_tokens", "decoder_input_tokens"
TARGETS, WEIGHTS = "decoder_target_tokens", "decoder_loss_weights"
ENCODER_SEGMENTS, ENCODER_POSITIONS = "encoder_segment_ids", "encoder_positions"
DECODER_SEGMENTS, DECODER_POSITIONS = "decoder_segment_ids", "decoder_positions"
FEATURES = (INPUTS, DECODER_INPUTS, TARGETS, WEIGHTS)
PACKING_FEATURES = (ENCODER_SEGMENTS, ENCODER_POSITIONS, DECODER_SEGMENTS, DECODER_POSITIONS)


def smoothed_cross_entropy(logits, targets, *, label_smoothing: float, z_loss: float):
    """Per-token (loss, z-loss part, plain cross-entropy), float32, as T5X computes them.

    Example: logits [[0., 0.]] (V=2), targets [0], no smoothing, z_loss=0 ->
      loss = cross-entropy = log 2, z part 0.
    """
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[
        ..., 0
    ]
    cross_entropy = log_z - target_logit
    if label_smoothing:
        confidence = 1.0 - label_smoothing
        low = label_smoothing / (vocab - 1)
        # sum_v q_v logit_v without materialising the (..., V) one-hot.
        expected_logit = low * jnp.sum(logits, axis=-1) + (confidence - low) * target_logit
        entropy = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low + 1e-20))
        smoothed = log_z - expected_logit - entropy
    else:
        smoothed = cross_entropy
    z_part = z_loss * jnp.square(log_z)
    return smoothed + z_part, z_part, cross_entropy


def sequence_counts(correct_BM, weights_BM, segment_ids_BM=None):
    """(sequences with every weighted target right, sequences), float32 scalars.

    A sequence is a row, or with `segment_ids_BM` one packed example (segment id > 0) of a row;
    only sequences with at least one weighted target count.

    Example: correct [[1, 0, 1, 1]], weights [[1, 1, 1, 0]], segments [[1, 1, 2, 0]] -> (1, 2):
      segment 1 has a wrong token, segment 2 is right.
    """
    real = weights_BM > 0
    if segment_ids_BM is None:
        segment_ids_BM = real.astype(jnp.int32)
    rows, length = weights_BM.shape
    index = (jnp.arange(rows)[:, None] * (length + 1) + segment_ids_BM).reshape(-1)
    size = rows * (length + 1)
    count = lambda x: jax.ops.segment_sum(x.reshape(-1).astype(jnp.float32), index, size)
    present = (count(real) > 0) & (jnp.arange(size) % (length + 1) != 0)
    wrong = count(real & ~correct_BM.astype(bool))
    return jnp.sum(present & (wrong == 0)).astype(jnp.float32), jnp.sum(present).astype(jnp.float32)


def _check_options(z_loss, label_smoothing, loss_normalizing_factor):
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
    if z_loss < 0.0:
        raise ValueError(f"z_loss must be >= 0, got {z_loss}")
    if loss_normalizing_factor is not None and not (
        isinstance(loss_normalizing_factor, int | float) and loss_normalizing_factor > 0
    ):
        raise ValueError(
            "loss_normalizing_factor must be None (divide by the number of real target tokens) "
            f"or a positive number (T5X's constant, e.g. batch * targets length), got "
            f"{loss_normalizing_factor!r}"
        )


def seq2seq(
    *,
    z_loss: float = 1e-4,
    label_smoothing: float = 0.0,
    loss_normalizing_factor: float | None = None,
    cross_attention_ignores: int | None = None,
    given_decoder_positions: bool = False,
    pad_id: int = 0,
    name: str = "seq2seq",
) -> Objective:
    """The encoder-decoder objective.

    Args:
      z_loss: weight of T5X's (log Z)^2 regulariser (T5X's default 1e-4).
      label_smoothing: mass s spread over the other V - 1 ids.
      loss_normalizing_factor: None divides the summed loss by the number of real target tokens
        of the whole batch; a number divides by that constant instead (T5X's pretraining
        setting; its `None` means an unnormalised sum, which lmsuite does not offer).
      cross_attention_ignores: an id the decoder's cross-attention does not attend to (MASS
        hides the encoder's [MASK] positions from the decoder, as its `enc_mask`).
      given_decoder_positions: every batch, packed or not, carries `decoder_positions` (MASS:
        the fragment's positions in the source); it is then required and declared.
      pad_id: padding id of the encoder inputs (unpacked rows).

    Metrics: `{name}_loss`, `{name}_accuracy` (per real target token), and
    `{name}_cross_entropy` (per token, without z-loss or smoothing), `{name}_z_loss`,
    `{name}_sequence_accuracy` (examples whose every target token is right).
    """
    _check_options(z_loss, label_smoothing, loss_normalizing_factor)

    given = (DECODER_POSITIONS,) if given_decoder_positions else ()

    def model_inputs(batch):
        require(batch, name, INPUTS, DECODER_INPUTS, *given)
        inputs = batch[INPUTS]
        kwargs = {"input_ids": inputs, "decoder_input_ids": batch[DECODER_INPUTS]}
        if ENCODER_SEGMENTS in batch:
            kwargs["segment_ids"] = batch[ENCODER_SEGMENTS]
            if ENCODER_POSITIONS in batch:
                kwargs["position_ids"] = batch[ENCODER_POSITIONS]
        else:
            kwargs["attention_mask"] = (inputs != pad_id).astype(jnp.int32)
        if DECODER_SEGMENTS in batch:
            kwargs["decoder_segment_ids"] = batch[DECODER_SEGMENTS]
        if DECODER_POSITIONS in batch:
            kwargs["decoder_position_ids"] = batch[DECODER_POSITIONS]
        if cross_attention_ignores is not None:
            kwargs["cross_attention_mask"] = (inputs != cross_attention_ignores).astype(jnp.int32)
        return kwargs

    def denominators(batch):
        require(batch, name, TARGETS, WEIGHTS)
        weights = batch[WEIGHTS]
        tokens = total_weight(weights)
        correct_shape = jnp.ones(weights.shape, bool)
        _, sequences = sequence_counts(correct_shape, weights, batch.get(DECODER_SEGMENTS))
        if loss_normalizing_factor is None:
            normalizer = tokens
        else:
            normalizer = jnp.asarray(loss_normalizing_factor, jnp.float32)
        return {name: normalizer, "target_tokens": tokens, "sequences": sequences}

    def per_token(outputs, batch):
        require(batch, name, TARGETS, WEIGHTS)
        logits, targets = outputs["lm_logits"], batch[TARGETS]
        if logits.shape[:-1] != targets.shape:
            raise ValueError(
                f"objective {name!r}: lm_logits {logits.shape} need targets of shape "
                f"{logits.shape[:-1]}, got {targets.shape}"
            )
        loss, z_part, cross_entropy = smoothed_cross_entropy(
            logits, targets, label_smoothing=label_smoothing, z_loss=z_loss
        )
        correct = jnp.argmax(logits, axis=-1) == targets
        return loss, z_part, cross_entropy, correct, batch[WEIGHTS].astype(jnp.float32)

    def terms(outputs, batch):
        loss, _, _, correct, weights = per_token(outputs, batch)
        return {name: TermSums(loss=jnp.sum(loss * weights), correct=jnp.sum(correct * weights))}

    def metric_sums(outputs, batch) -> Mapping[str, MetricSum]:
        _, z_part, cross_entropy, correct, weights = per_token(outputs, batch)
        right, _ = sequence_counts(correct, weights, batch.get(DECODER_SEGMENTS))
        return {
            f"{name}_cross_entropy": MetricSum(jnp.sum(cross_entropy * weights), "target_tokens"),
            f"{name}_z_loss": MetricSum(jnp.sum(z_part * weights), "target_tokens"),
            f"{name}_sequence_accuracy": MetricSum(right, "sequences"),
        }

    def num_tokens(batch):
        inputs = batch[INPUTS]
        if ENCODER_SEGMENTS in batch:
            encoder = total_weight(batch[ENCODER_SEGMENTS] > 0)
        else:
            encoder = total_weight(inputs != pad_id)
        return encoder + total_weight(batch[WEIGHTS] > 0)

    return Objective(
        name=name,
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=num_tokens,
        accuracy_denominators={name: "target_tokens"},
        metric_sums=metric_sums,
        features=FEATURES + given,
        heads=("lm",),
        metrics=tuple(
            f"{name}_{m}"
            for m in ("loss", "accuracy", "cross_entropy", "z_loss", "sequence_accuracy")
        ),
        prediction_features=(TARGETS, WEIGHTS),
        learning_metrics=(f"{name}_accuracy", f"{name}_cross_entropy"),
        prediction_name="target",
    )
