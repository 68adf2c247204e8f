"""Bad configs and bad inputs fail at entry with the offending value in the message."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.models import DebertaOptions, ModelConfig, Transformer
from lmsuite.models.inputs import position_limit

TINY = dict(vocab_size=50, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_length=12)
BIASED = DebertaOptions(position_biased_input=True)  # DeBERTa v1's absolute table on the input
EMD = dict(
    position_type="deberta", deberta=DebertaOptions(emd_layers=2), num_layers=2,
    norm_position="post", final_norm=False,
)  # fmt: skip


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(architecture="encdec"), "architecture must be one of"),
        (dict(d_model=30, num_heads=4), "d_model=30 is not divisible by num_heads=4"),
        (dict(activation="gelu2"), "activation must be one of"),
        (dict(heads=("mlm", "nsp")), "unknown heads \\['nsp'\\]"),
        (
            dict(architecture="decoder", heads=("mlm",)),
            r"heads \['mlm'\] need another architecture: 'decoder' takes heads from",
        ),
        (
            dict(architecture="encoder_decoder", heads=("lm",)),
            "an encoder-decoder reads no token types: .*type_vocab_size must be 0, got 2",
        ),
        (dict(dropout_rate=1.5), "dropout_rate must lie in \\[0, 1\\), got 1.5"),
        (dict(vocab_size=0), "vocab_size must be a positive int, got 0"),
        (dict(float32_scores="no"), "float32_scores must be True or False, got 'no'"),
    ],
)
def test_bad_config_is_named(changes, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{**TINY, **changes})


def _init(config, ids, **kw):
    model = Transformer(config)
    return model, model.init(jax.random.PRNGKey(0), ids, **kw)


def test_bad_inputs_are_named():
    cfg = ModelConfig(**TINY)
    ids = jnp.ones((2, 5), jnp.int32)
    model, variables = _init(cfg, ids)
    apply = lambda x, **kw: model.apply(variables, x, **kw)
    with pytest.raises(
        ValueError, match="input_ids must be \\(batch, length\\), got shape \\(5,\\)"
    ):
        apply(ids[0])
    with pytest.raises(ValueError, match="input_ids must hold integers"):
        apply(ids.astype(jnp.float32))
    with pytest.raises(ValueError, match="input_ids holds id 50, outside \\[0, 50\\)"):
        apply(ids.at[1, 2].set(50))
    with pytest.raises(ValueError, match="input_ids holds id -1"):
        apply(ids.at[0, 0].set(-1))
    with pytest.raises(ValueError, match="length 13, longer than the position table"):
        apply(jnp.ones((1, 13), jnp.int32))
    with pytest.raises(ValueError, match="token_type_ids holds id 2, outside \\[0, 2\\)"):
        apply(ids, token_type_ids=jnp.full_like(ids, 2))
    with pytest.raises(ValueError, match="token_type_ids must have the shape of input_ids"):
        apply(ids, token_type_ids=jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="attention_mask must be \\(B, 5\\) or \\(B, 5, 5\\)"):
        apply(ids, attention_mask=jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="masked_positions must be \\(batch=2, P\\)"):
        apply(ids, masked_positions=jnp.zeros((3,), jnp.int32))
    # Each family's module takes its own inputs only: an encoder has no prefix.
    with pytest.raises(TypeError, match="unexpected keyword argument 'prefix_mask'"):
        apply(ids, prefix_mask=jnp.ones_like(ids))
    decoder = ModelConfig(**TINY, architecture="decoder", heads=("lm",))
    decoder_model, decoder_variables = _init(decoder, ids)
    with pytest.raises(ValueError, match="prefix_mask is for architecture='prefix_lm'"):
        decoder_model.apply(decoder_variables, ids, prefix_mask=jnp.ones_like(ids))


@pytest.mark.parametrize(
    "changes,limit",
    [
        (dict(), 12),
        (dict(position_offset=2), 10),  # RoBERTa's two reserved rows
        (dict(position_type="sinusoidal", position_offset=2), 10),
        (dict(position_type="tupe"), 12),
        (dict(position_type="learned_relative"), 12),
        (dict(position_type="deberta", deberta=BIASED), 12),
        (dict(position_type="deberta", deberta=BIASED, position_offset=2), 10),
    ],
)
def test_position_ids_past_the_table_are_named(changes, limit):
    """Given position ids index the table (XLA's gather would clamp a stray one silently): the
    last row is taken, one past it is refused naming the table's size, and so is a negative."""
    cfg = ModelConfig(**TINY, **changes)
    ids = jnp.ones((1, 5), jnp.int32)
    model, variables = _init(cfg, ids)
    apply = lambda p: model.apply(variables, ids, position_ids=jnp.asarray(p, jnp.int32)[None])
    assert np.isfinite(apply([0, 1, 2, 3, limit - 1])["mlm_logits"]).all()
    expected = rf"position_ids holds {limit}, outside \[0, {limit}\): .* has {limit} positions"
    with pytest.raises(ValueError, match=expected):
        apply([0, 1, 2, 3, limit])
    with pytest.raises(ValueError, match=r"position_ids holds -1, outside"):
        apply([-1, 0, 1, 2, 3])


@pytest.mark.parametrize(
    "changes,limit",
    [
        (dict(), 12),
        (dict(position_offset=2), 10),
        (dict(position_type="tupe"), 12),
        (dict(position_type="deberta", deberta=BIASED, position_offset=2), 10),
        (dict(position_type="t5_relative"), None),
        (dict(position_type="deberta", deberta=DebertaOptions()), None),  # clamped distances
        (EMD, 12),  # the enhanced mask decoder's own table of max_length positions
    ],
)
def test_position_limit_is_the_shortest_table(changes, limit):
    assert position_limit(ModelConfig(**{**TINY, **changes})) == limit


def test_position_ids_of_a_relative_model_index_no_table():
    """T5's buckets take any distance: ids past max_length are not refused."""
    cfg = ModelConfig(**TINY, position_type="t5_relative")
    ids = jnp.ones((1, 5), jnp.int32)
    model, variables = _init(cfg, ids)
    out = model.apply(variables, ids, position_ids=jnp.arange(100, 105, dtype=jnp.int32)[None])
    assert np.isfinite(out["mlm_logits"]).all()


def test_architecture_specific_inputs_are_required():
    ids = jnp.ones((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="needs decoder_input_ids"):
        seq2seq = dict(architecture="encoder_decoder", heads=("lm",), type_vocab_size=0)
        _init(ModelConfig(**TINY, **seq2seq), ids)
    with pytest.raises(ValueError, match="needs prefix_mask"):
        _init(ModelConfig(**TINY, architecture="prefix_lm", heads=("lm",)), ids)


def test_masked_positions_gather_before_the_vocabulary():
    cfg = ModelConfig(**TINY)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 6)), jnp.int32)
    model, variables = _init(cfg, ids)
    full = model.apply(variables, ids)["mlm_logits"]
    pos = jnp.array([[5, 0], [2, 2]])
    some = model.apply(variables, ids, masked_positions=pos)["mlm_logits"]
    assert some.shape == (2, 2, 50)
    np.testing.assert_allclose(some[0, 0], full[0, 5], atol=1e-6)
    np.testing.assert_allclose(some[1, 1], full[1, 2], atol=1e-6)
