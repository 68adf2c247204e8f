"""Left-to-right language modelling and prefix LM over SeqIO's `LMFeatureConverter` and
`PrefixLMFeatureConverter` features."""

from lmsuite.objectives.base import (
    Objective,
    optional,
    require,
    token_cross_entropy,
    total_weight,
)


def causal_lm(
    *,
    inputs: str = "decoder_input_tokens",
    targets: str = "decoder_target_tokens",
    weights: str = "decoder_loss_weights",
    segment_ids: str = "decoder_segment_ids",
    positions: str = "decoder_positions",
    prefix: str | None = None,
    pad_id: int = 0,
    name: str = "causal_lm",
) -> Objective:
    """Next-token cross-entropy of the `lm` head; `prefix` names the feature marking the
    bidirectional prefix (prefix LM).

    SeqIO's converters already shift: `decoder_input_tokens` is the target sequence moved right
    by one with a 0 (BOS) in front, so logits at position i are scored against targets[i].
    """

    def model_inputs(batch):
        require(batch, name, inputs)
        kwargs = {"input_ids": batch[inputs]}
        kwargs |= optional(batch, segment_ids=segment_ids, position_ids=positions)
        if prefix is not None:
            require(batch, name, prefix)
            kwargs["prefix_mask"] = batch[prefix]
        return kwargs

    def denominators(batch):
        require(batch, name, weights)
        return {"lm": total_weight(batch[weights])}

    def terms(outputs, batch):
        require(batch, name, targets, weights)
        return {"lm": token_cross_entropy(outputs["lm_logits"], batch[targets], batch[weights])}

    def num_tokens(batch):
        return total_weight(batch[targets] != pad_id)

    return Objective(
        name=name,
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=num_tokens,
        features=(inputs, targets, weights) + (() if prefix is None else (prefix,)),
        heads=("lm",),
        metrics=("lm_loss", "lm_accuracy"),
        prediction_features=(targets, weights),
        learning_metrics=("lm_accuracy", "lm_loss"),
        prediction_name="LM",
    )


def prefix_lm(*, prefix: str = "decoder_causal_attention", **kwargs) -> Objective:
    """Prefix LM: `causal_lm` with the prefix taken from `decoder_causal_attention`."""
    return causal_lm(prefix=prefix, name="prefix_lm", **kwargs)
