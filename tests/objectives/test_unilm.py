"""UniLM (lmsuite.objectives.unilm): the per-example mask against the data module's tf statement
and the paper's matrices, and the model's dependencies under each mode through gradients."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite import cli
from lmsuite.data.preprocessors import unilm as unilm_data
from lmsuite.models import Transformer
from lmsuite.models.embedder import Embedder
from lmsuite.objectives import unilm
from lmsuite.training import structure_checks

L = 8


def _mask(modes, sources, input_mask):
    return np.asarray(
        unilm.unilm_attention_mask(
            jnp.asarray(modes, jnp.int32), jnp.asarray(sources, jnp.int32), jnp.asarray(input_mask)
        )
    )


_JITTED_MASK = jax.jit(unilm.unilm_attention_mask)


def test_mode_ids_and_type_table_are_the_data_modules():
    got = (unilm.BIDIRECTIONAL, unilm.LEFT_TO_RIGHT, unilm.RIGHT_TO_LEFT, unilm.SEQ2SEQ)
    want = (
        unilm_data.BIDIRECTIONAL,
        unilm_data.LEFT_TO_RIGHT,
        unilm_data.RIGHT_TO_LEFT,
        unilm_data.SEQ2SEQ,
    )
    assert got == want
    assert unilm.TYPE_VOCAB_SIZE == unilm_data.TYPE_VOCAB_SIZE


def test_mask_equals_the_data_modules_tf_mask_on_random_rows():
    rng = np.random.default_rng(0)
    batch, length = 6, 16  # one shape: one compilation for the 8 x 6 random rows
    for _ in range(8):
        modes = rng.integers(0, 4, size=batch)
        lengths = rng.integers(5, length + 1, size=batch)  # real tokens, right-padded
        # As the data: pairs have source_length = split + 2 with 1 <= split < n - 3 chunk tokens.
        sources = np.where(
            np.isin(modes, (unilm.BIDIRECTIONAL, unilm.SEQ2SEQ)),
            [rng.integers(3, n - 1) for n in lengths],
            0,
        )
        input_mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
        got = np.asarray(_JITTED_MASK(modes, sources, input_mask))
        assert got.shape == (batch, length, length) and got.dtype == bool
        for b in range(batch):
            n = lengths[b]
            want = unilm_data.unilm_attention_mask(
                mode=int(modes[b]), length=int(n), source_length=int(sources[b])
            ).numpy()
            np.testing.assert_array_equal(got[b, :n, :n], want, err_msg=f"row {b}")
            assert not got[b, :, n:].any()  # padding keys are never attended


def test_mask_is_the_papers_on_a_hand_written_case():
    # Figure 1 of the paper: [SOS] S1 [EOS] is the source (3 tokens), S2 [EOS] the target (3);
    # one padding position. Rows are queries.
    input_mask = [[1, 1, 1, 1, 1, 1, 0]] * 4
    modes = [unilm.SEQ2SEQ, unilm.LEFT_TO_RIGHT, unilm.RIGHT_TO_LEFT, unilm.BIDIRECTIONAL]
    got = _mask(modes, [3, 0, 0, 3], input_mask).astype(int)
    seq2seq = [
        [1, 1, 1, 0, 0, 0, 0],  # the source never sees the target
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],  # a target sees the source and itself ...
        [1, 1, 1, 1, 1, 0, 0],  # ... and the targets on its left
        [1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 0],  # padding query; the padding key stays hidden
    ]
    np.testing.assert_array_equal(got[0], seq2seq)
    lower = np.tril(np.ones((7, 7), int))
    lower[:, 6] = 0
    np.testing.assert_array_equal(got[1], lower)
    upper = np.triu(np.ones((7, 7), int))
    upper[:, 6] = 0
    np.testing.assert_array_equal(got[2], upper)
    np.testing.assert_array_equal(got[3], np.ones((7, 7), int) * [1, 1, 1, 1, 1, 1, 0])


def test_mask_works_under_jit_and_takes_b1_features():
    modes, sources = np.array([[3], [1]], np.int32), np.array([[2], [0]], np.int32)
    input_mask = np.ones((2, 4), np.int32)
    jitted = jax.jit(unilm.unilm_attention_mask)(modes, sources, input_mask)
    np.testing.assert_array_equal(np.asarray(jitted), _mask(modes[:, 0], sources[:, 0], input_mask))


@pytest.mark.parametrize(
    "modes, sources, input_mask, match",
    [
        ([4], [0], [[1, 1, 1]], "unilm_mode holds 4; expected 0"),
        ([3], [5], [[1, 1, 1]], r"source_length holds 5, outside \[0, L=3\]"),
        ([0, 0], [0], [[1, 1, 1], [1, 1, 1]], r"source_length must be \(2,\) or \(2, 1\)"),
        ([0], [0], [1, 1, 1], r"input_mask must be \(B, L\)"),
    ],
)
def test_bad_mask_inputs_are_named(modes, sources, input_mask, match):
    with pytest.raises(ValueError, match=match):
        _mask(modes, sources, input_mask)


def _batch(mode, source_length, ids):
    length = ids.shape[1]
    return {
        "input_ids": jnp.asarray(ids),
        "input_mask": jnp.ones((1, length), jnp.int32),
        "token_type_ids": jnp.zeros((1, length), jnp.int32),
        "masked_positions": jnp.arange(length, dtype=jnp.int32)[None],
        "masked_ids": jnp.zeros((1, length), jnp.int32),
        "masked_weights": jnp.ones((1, length), jnp.float32),
        "unilm_mode": jnp.asarray([mode], jnp.int32),
        "source_length": jnp.asarray([source_length], jnp.int32),
    }


def test_objective_feeds_the_full_mask_and_the_token_types():
    objective = unilm.unilm_mlm()
    kwargs = objective.model_inputs(_batch(unilm.SEQ2SEQ, 3, np.full((1, 6), 9, np.int32)))
    assert kwargs["attention_mask"].shape == (1, 6, 6)
    assert "token_type_ids" in kwargs and "masked_positions" in kwargs
    batch = _batch(unilm.SEQ2SEQ, 3, np.full((1, 6), 9, np.int32))
    with pytest.raises(ValueError, match=r"needs batch features \['source_length'\]"):
        objective.model_inputs({k: v for k, v in batch.items() if k != "source_length"})
    with pytest.raises(ValueError, match="packed batch"):
        objective.model_inputs(batch | {"segment_ids": batch["input_mask"]})


def test_model_check_names_the_type_table_it_needs():
    config = cli.model_config_from_gin(["models/bert_tiny.gin"], [])
    (problem,) = structure_checks.unilm_model_problems(config, None)
    assert "type_vocab_size >= 6, got 2" in problem
    tiny = cli.model_config_from_gin(["models/unilm_tiny.gin"], [])
    assert structure_checks.unilm_model_problems(tiny, None) == []


@pytest.fixture(scope="module")
def tiny_model():
    config = cli.model_config_from_gin(
        ["models/unilm_tiny.gin"],
        ["ModelConfig.dropout_rate = 0.0", "ModelConfig.attention_dropout_rate = 0.0"],
    )
    model = Transformer(config)
    ids = np.random.default_rng(3).integers(5, config.vocab_size, size=(1, L)).astype(np.int32)
    inputs = unilm.unilm_mlm().model_inputs(_batch(unilm.BIDIRECTIONAL, 0, ids))
    params = jax.jit(lambda rng: model.init(rng, **inputs))(jax.random.PRNGKey(0))["params"]
    return model, params, ids


def _dependencies(tiny_model, mode, source_length) -> np.ndarray:
    """|| d (mlm_logits[t] . w) / d embedded[s] || through the objective's inputs: (L, L)."""
    model, params, ids = tiny_model
    inputs = unilm.unilm_mlm().model_inputs(_batch(mode, source_length, ids))
    w_V = jnp.asarray(np.random.default_rng(1).normal(size=model.config.vocab_size), jnp.float32)

    def f(delta_1LD):
        def add_delta(next_fun, args, kw, context):
            out = next_fun(*args, **kw)
            if isinstance(context.module, Embedder) and context.method_name == "__call__":
                return out + delta_1LD
            return out

        with nn.intercept_methods(add_delta):
            out = model.apply({"params": params}, **inputs)
        return out["mlm_logits"][0] @ w_V

    jac = jax.jit(jax.jacrev(f))(jnp.zeros((1, L, model.config.d_model), jnp.float32))
    return np.linalg.norm(np.asarray(jac)[:, 0], axis=-1)


@pytest.mark.parametrize(
    "mode, source_length",
    [
        (unilm.BIDIRECTIONAL, 3),
        (unilm.LEFT_TO_RIGHT, 0),
        (unilm.RIGHT_TO_LEFT, 0),
        (unilm.SEQ2SEQ, 3),
    ],
)
def test_model_dependencies_follow_the_mode(tiny_model, mode, source_length):
    jac = _dependencies(tiny_model, mode, source_length)
    t, s = np.arange(L)[:, None], np.arange(L)[None, :]
    allowed = {
        unilm.BIDIRECTIONAL: np.ones((L, L), bool),
        unilm.LEFT_TO_RIGHT: s <= t,
        unilm.RIGHT_TO_LEFT: s >= t,
        unilm.SEQ2SEQ: (s < source_length) | ((s <= t) & (t >= source_length)),
    }[mode]
    leaked = np.argwhere(~allowed & (jac != 0))
    assert leaked.size == 0, f"outputs t depend on inputs s they must not see: (t, s) = {leaked}"
    missing = np.argwhere(allowed & (jac < 1e-6))
    assert missing.size == 0, f"outputs t ignore inputs s they should see: (t, s) = {missing}"
    if mode == unilm.SEQ2SEQ:
        assert jac[0, source_length - 1] > 0 and jac[0, source_length] == 0
