"""UniLM's loss: masked LM in one shared Transformer under a per-example self-attention mask.

UniLM (Dong et al. 2019) trains a single BERT-shaped encoder on four cloze tasks that differ only
in what each token may attend to: bidirectional, left-to-right, right-to-left and seq2seq. The
data (`lmsuite.data.preprocessors.unilm`) draws the mode per example and gives `unilm_mode`,
`source_length` and the mode's token types (0..5, the reference's `--new_segment_ids`); this
module turns mode and lengths into the (B, L, L) mask the model applies, so the model itself
never names an objective. The mask is built here rather than in `lmsuite.layers.masks` because
objectives import no layers: the model receives it as an ordinary full `attention_mask`.

The mode ids are the data module's (`preprocessors.unilm.BIDIRECTIONAL` ...); a test checks they
agree, and that `unilm_attention_mask` equals the data module's tf statement of the mask.
"""

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.objectives.base import Objective, require
from lmsuite.objectives.mlm import mlm

BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ = 0, 1, 2, 3
NUM_MODES = 4
FEATURES = ("unilm_mode", "source_length")
# Types 0/1 (bidirectional), 2, 3, 4/5 (seq2seq): the type table needs six rows.
TYPE_VOCAB_SIZE = 6


def _per_row(name: str, x, batch: int) -> jax.Array:
    """A (B,) or (B, 1) integer feature as (B,); anything else is refused."""
    if x.shape not in ((batch,), (batch, 1)):
        raise ValueError(f"{name} must be ({batch},) or ({batch}, 1), got {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must hold integers, got dtype {x.dtype}")
    return x.reshape(batch)


def _check_values(mode_B, source_length_B, length: int) -> None:
    """Range checks, where the values are known (outside jit): a mode outside 0..3 would
    otherwise select no mask at all."""
    if isinstance(mode_B, jax.core.Tracer) or isinstance(source_length_B, jax.core.Tracer):
        return
    modes, sources = np.asarray(mode_B), np.asarray(source_length_B)
    bad = modes[(modes < 0) | (modes >= NUM_MODES)]
    if bad.size:
        raise ValueError(
            f"unilm_mode holds {int(bad[0])}; expected 0 (bidirectional), 1 (left-to-right), "
            "2 (right-to-left) or 3 (seq2seq)"
        )
    bad = sources[(sources < 0) | (sources > length)]
    if bad.size:
        raise ValueError(f"source_length holds {int(bad[0])}, outside [0, L={length}]")


def unilm_attention_mask(mode_B, source_length_B, input_mask_BL) -> jax.Array:
    """bool (B, L, L): entry (b, i, j) is True when query i of row b may attend to key j.

    By mode: bidirectional, every key; left-to-right, j <= i; right-to-left, j >= i; seq2seq,
    a source query (i < source_length: `[CLS] A [SEP]`) sees the source only and a target query
    sees the source and the targets up to itself. Padding keys (input_mask 0) are never seen.

    Example (L=5, one seq2seq row, source_length 2, input_mask [1, 1, 1, 1, 0]), rows are queries:
      [[1 1 0 0 0]
       [1 1 0 0 0]
       [1 1 1 0 0]
       [1 1 1 1 0]
       [1 1 1 1 0]]
    (the last row is a padding query: it sees what a target there would, minus the padding key;
    nothing reads its output).
    """
    if input_mask_BL.ndim != 2:
        raise ValueError(f"input_mask must be (B, L), got shape {tuple(input_mask_BL.shape)}")
    batch, length = input_mask_BL.shape
    mode_B = _per_row("unilm_mode", mode_B, batch)
    source_B = _per_row("source_length", source_length_B, batch)
    _check_values(mode_B, source_B, length)
    i_1L1 = jnp.arange(length)[None, :, None]
    j_11L = jnp.arange(length)[None, None, :]
    source_B11 = source_B[:, None, None]
    in_source_key = j_11L < source_B11
    target_query = i_1L1 >= source_B11
    by_mode = (
        jnp.ones((1, length, length), bool),
        j_11L <= i_1L1,
        j_11L >= i_1L1,
        in_source_key | ((j_11L <= i_1L1) & target_query),
    )
    mode_B11 = mode_B[:, None, None]
    allowed_BLL = jnp.zeros((batch, length, length), bool)
    for mode, allowed in enumerate(by_mode):
        allowed_BLL = jnp.where(mode_B11 == mode, allowed, allowed_BLL)
    return allowed_BLL & input_mask_BL.astype(bool)[:, None, :]


def unilm_mlm(
    *,
    inputs: str = "input_ids",
    input_mask: str = "input_mask",
    masked_positions: str = "masked_positions",
    masked_targets: str = "masked_ids",
    masked_weights: str = "masked_weights",
    token_type_ids: str = "token_type_ids",
    mode: str = "unilm_mode",
    source_length: str = "source_length",
    pad_id: int = 0,
) -> Objective:
    """UniLM's masked LM over `EncoderMlmFeatureConverter(labels=FEATURES)` batches: the MLM
    objective (`objectives.mlm`, gathered predictions, term `mlm`) whose model inputs carry the
    per-example (B, L, L) mask of `unilm_attention_mask` as `attention_mask` and always the token
    types (they tell the model the mode: it needs `type_vocab_size >= TYPE_VOCAB_SIZE`).

    UniLM's examples are one per row (the mode is per row), so packed batches are refused.
    """
    base = mlm(
        inputs=inputs,
        input_mask=input_mask,
        masked_positions=masked_positions,
        masked_targets=masked_targets,
        masked_weights=masked_weights,
        token_type_ids=token_type_ids,
        pad_id=pad_id,
    )

    def model_inputs(batch):
        require(batch, "unilm_mlm", inputs, input_mask, token_type_ids, masked_positions)
        require(batch, "unilm_mlm", mode, source_length)
        if "segment_ids" in batch:
            raise ValueError(
                "unilm_mlm reads one example per row (its mode is per row); got a packed batch "
                "with segment_ids: set make_recipe.pack = False"
            )
        kwargs = base.model_inputs(batch)
        kwargs["attention_mask"] = unilm_attention_mask(
            batch[mode], batch[source_length], batch[input_mask]
        )
        return kwargs

    return Objective(
        name="unilm_mlm",
        model_inputs=model_inputs,
        denominators=base.denominators,
        terms=base.terms,
        num_tokens=base.num_tokens,
        features=base.features + (token_type_ids, mode, source_length),
        heads=base.heads,
        metrics=base.metrics,
        prediction_features=base.prediction_features,
        learning_metrics=base.learning_metrics,
        prediction_name=base.prediction_name,
    )
