"""StructBERT's loss: masked LM + word structure + sentence structure (Wang et al. 2020).

The paper (arXiv 1908.04577, §2.2-2.3) predicts the original token at every position of a
shuffled trigram "with the same output layer as the MLM" and classifies the relation of the two
segments (next / previous / other document) from [CLS]; the losses are summed. Here each term is
a mean over its own targets, and the total is mlm + word_structure + sentence:

  mlm             cross-entropy at `masked_positions` against `masked_ids`
  word_structure  cross-entropy at `shuffled_positions` against `shuffled_ids` (the originals)
  sentence        the classifier head's 3-way cross-entropy against `sentence_relation_label`

Both token terms go through the model's one MLM head: the model gathers the concatenated
positions [masked_positions | shuffled_positions] (B, P + S) once and the logits are split.
"""

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.objectives.base import Objective, require, token_cross_entropy, total_weight
from lmsuite.objectives.mlm import mlm

SHUFFLED_FEATURES = ("shuffled_positions", "shuffled_ids", "shuffled_weights")
SENTENCE_LABEL = "sentence_relation_label"
# next sentence, previous sentence, another document's (`preprocessors.sentence_pairs`).
NUM_RELATIONS = 3


def structbert(
    *,
    inputs: str = "input_ids",
    input_mask: str = "input_mask",
    masked_positions: str = "masked_positions",
    masked_targets: str = "masked_ids",
    masked_weights: str = "masked_weights",
    shuffled_positions: str = "shuffled_positions",
    shuffled_targets: str = "shuffled_ids",
    shuffled_weights: str = "shuffled_weights",
    token_type_ids: str = "token_type_ids",
    sentence_label: str = SENTENCE_LABEL,
    word_structure_weight: float = 1.0,
    sentence_weight: float = 1.0,
    pad_id: int = 0,
) -> Objective:
    """The three StructBERT terms over `EncoderMlmFeatureConverter(labels=(sentence_label,),
    span_features=SHUFFLED_FEATURES)` batches: (B, L) inputs, (B, P) MLM predictions, (B, S)
    shuffled predictions (weights 0 on padding slots; the converter may hand them over as
    int32, they are cast), and a (B,) or (B, 1) label in [0, 3) for a 3-label classifier head.

    Reads `mlm_logits` (B, P + S, V) and `classifier_logits` (B, 3). The terms are
    `mlm`, `word_structure` and `sentence`; the two weights scale the last two (1.0: the
    paper's plain sum).
    """
    base = mlm(
        inputs=inputs,
        input_mask=input_mask,
        masked_positions=masked_positions,
        masked_targets=masked_targets,
        masked_weights=masked_weights,
        token_type_ids=token_type_ids,
        sentence_label=sentence_label,
        pad_id=pad_id,
    )

    shuffled = (shuffled_positions, shuffled_targets, shuffled_weights)

    def check(batch):
        require(batch, "structbert", masked_positions, masked_targets, masked_weights)
        require(batch, "structbert", shuffled_positions, shuffled_targets, shuffled_weights)
        require(batch, "structbert", sentence_label)
        if "segment_ids" in batch:
            raise ValueError(
                "structbert reads one sentence pair per row (one label each); got a packed "
                "batch with segment_ids: set make_recipe.pack = False"
            )
        width = batch[masked_positions].shape
        for name in (masked_targets, masked_weights):
            if batch[name].shape != width:
                raise ValueError(
                    f"{name} must have the shape of {masked_positions} {width}, got "
                    f"{batch[name].shape}"
                )
        shuffled = batch[shuffled_positions].shape
        if len(shuffled) != 2 or shuffled[0] != width[0]:
            raise ValueError(
                f"{shuffled_positions} must be (B={width[0]}, S), got {tuple(shuffled)}"
            )
        for name in (shuffled_targets, shuffled_weights):
            if batch[name].shape != shuffled:
                raise ValueError(
                    f"{name} must have the shape of {shuffled_positions} {tuple(shuffled)}, got "
                    f"{tuple(batch[name].shape)}"
                )
        label = batch[sentence_label]
        if label.shape not in ((width[0],), (width[0], 1)):
            raise ValueError(
                f"{sentence_label} must be ({width[0]},) or ({width[0]}, 1), got "
                f"{tuple(label.shape)}"
            )
        if not isinstance(label, jax.core.Tracer):  # values are known outside jit
            bad = np.asarray(label)[(np.asarray(label) < 0) | (np.asarray(label) >= NUM_RELATIONS)]
            if bad.size:
                raise ValueError(
                    f"{sentence_label} holds {int(bad[0])}; expected 0 (next), 1 (previous) or "
                    "2 (other document)"
                )

    def model_inputs(batch):
        check(batch)
        kwargs = base.model_inputs(batch)
        positions = (batch[masked_positions], batch[shuffled_positions])
        kwargs["masked_positions"] = jnp.concatenate(
            [p.astype(jnp.int32) for p in positions], axis=1
        )
        return kwargs

    def denominators(batch):
        check(batch)
        return base.denominators(batch) | {"word_structure": total_weight(batch[shuffled_weights])}

    def terms(outputs, batch):
        logits = outputs["mlm_logits"]
        predictions = batch[masked_positions].shape[1]
        expected = predictions + batch[shuffled_positions].shape[1]
        if logits.ndim != 3 or logits.shape[1] != expected:
            raise ValueError(
                f"mlm_logits must be (B, P + S = {expected}, V) (the model gathers "
                f"{masked_positions} then {shuffled_positions}), got {tuple(logits.shape)}"
            )
        classifier = outputs["classifier_logits"]
        if classifier.shape[-1] != NUM_RELATIONS:
            raise ValueError(
                f"classifier_logits must have {NUM_RELATIONS} labels (next / previous / other "
                f"document), got shape {tuple(classifier.shape)}: set ModelConfig.num_labels = 3"
            )
        mlm_part = {"mlm_logits": logits[:, :predictions], "classifier_logits": classifier}
        word = token_cross_entropy(
            logits[:, predictions:],
            batch[shuffled_targets],
            batch[shuffled_weights].astype(jnp.float32),
        )
        return base.terms(mlm_part, batch) | {"word_structure": word}

    return Objective(
        name="structbert",
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=base.num_tokens,
        term_weights={"word_structure": word_structure_weight, "sentence": sentence_weight},
        features=base.features + (token_type_ids, *shuffled),
        heads=base.heads,
        metrics=tuple(
            f"{term}_{m}"
            for term in ("mlm", "word_structure", "sentence")
            for m in ("loss", "accuracy")
        ),
        prediction_features=base.prediction_features,
        learning_metrics=base.learning_metrics,
        prediction_name=base.prediction_name,
        label_metrics=base.label_metrics,
    )
