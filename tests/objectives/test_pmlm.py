"""UniLMv2 PMLM: the attention mask from the compact features (a hand-built case and properties
over the data module's examples) and the AE + PAR loss."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite import cli
from lmsuite.data import feature_converters
from lmsuite.data.preprocessors import pmlm as pmlm_data
from lmsuite.models import Transformer
from lmsuite.objectives import pmlm

CLS, SEP, MASK, PSEUDO = 2, 3, 4, 999


def test_hand_built_mask_of_the_papers_example():
    # x1..x6 = a b c d e f; blocks {b} and {d e}; order {d e} then {b}; one padding slot.
    # index: 0 CLS, 1 a, 2 M, 3 c, 4 M, 5 M, 6 f, 7 SEP | 8 P(d) 9 P(e) 10 d 11 e | 12 P(b)
    # 13 b | 14 pad
    step = jnp.array([[0] * 8 + [1, 1, 1, 1, 2, 2, 0]])
    pseudo = jnp.array([[0] * 8 + [1, 1, 0, 0, 1, 0, 0]])
    input_mask = jnp.array([[1] * 14 + [0]])
    main = "11111111"
    want = [
        *[main + "0000000"] * 8,  # the main sequence ([M] included) sees the main sequence
        main + "1100000",  # P(d): main, the [P]s of its step
        main + "1100000",  # P(e)
        main + "0011000",  # d (copy, step 1): main, copies of steps <= 1
        main + "0011000",  # e
        main + "0011100",  # P(b): main, copies of step 1, its own [P]
        main + "0011010",  # b (copy, step 2): main, copies of steps <= 2
        main + "0000000",  # padding query: the main sequence; the padding key is never seen
    ]
    want = np.array([[c == "1" for c in row] for row in want])
    got = pmlm.pmlm_attention_mask(step, pseudo, input_mask)
    np.testing.assert_array_equal(np.asarray(got[0]), want)
    jitted = jax.jit(pmlm.pmlm_attention_mask)(step, pseudo, input_mask)
    np.testing.assert_array_equal(np.asarray(jitted[0]), want)


def test_mask_refuses_malformed_features():
    ok = jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="pmlm_step must have input_mask's shape"):
        pmlm.pmlm_attention_mask(jnp.zeros((1, 3), jnp.int32), ok, ok)
    with pytest.raises(ValueError, match="marks a main-sequence token"):
        pmlm.pmlm_attention_mask(ok, jnp.array([[0, 1, 0, 0]]), ok + 1)


@functools.cache
def _batch(num=40, length=64, seed=3):
    predictions = pmlm_data.default_predictions(length)
    stream = np.arange(num * 200, dtype=np.int32) % 900 + 50
    ds = tf.data.Dataset.from_tensor_slices({"targets": stream.reshape(num, 200)})
    lengths = {"input_ids": length, "masked_ids": predictions}
    with seqio.map_seed_manager(seed):
        ds = pmlm_data.pmlm(
            ds,
            sequence_length=lengths,
            cls_id=CLS,
            sep_id=SEP,
            mask_id=MASK,
            pseudo_id=PSEUDO,
            vocab_size=1000,
            special_ids=(0, 1, CLS, SEP, MASK),
        )
    converter = feature_converters.EncoderMlmFeatureConverter(
        span_features=(pmlm_data.PSEUDO_POSITIONS,), sequence_features=pmlm_data.FEATURES
    )
    return next(iter(converter(ds, lengths).batch(num).as_numpy_iterator()))


def test_no_pseudo_token_sees_its_own_or_a_later_block():
    batch = _batch()
    allowed = np.asarray(
        pmlm.pmlm_attention_mask(batch["pmlm_step"], batch["pmlm_pseudo"], batch["input_mask"])
    )
    checked = 0
    for b in range(len(allowed)):
        ids, step, pseudo = batch["input_ids"][b], batch["pmlm_step"][b], batch["pmlm_pseudo"][b]
        real = batch["input_mask"][b].astype(bool)
        m = int(batch["masked_weights"][b].sum())
        masked = batch["masked_positions"][b][:m]
        # The step each masked main position is predicted at (its [P]'s step).
        step_of = dict(zip(masked, step[batch["pseudo_positions"][b][:m]], strict=True))
        assert np.diag(allowed[b])[real].all()  # every token sees itself
        assert not allowed[b][:, ~real].any()  # nobody sees padding
        copies = (step > 0) & (pseudo == 0)
        for q in np.flatnonzero(real):
            seen = allowed[b, q]
            if step[q] == 0:  # main sequence, [M] included: no appended token at all
                assert not seen[step > 0].any()
                continue
            if pseudo[q]:
                k = step[q]
                # Copies: only of earlier steps. Main sequence: a position of block k or later
                # holds [M], never its original.
                assert not (seen & copies & (step >= k)).any()
                later = [p for p, s in step_of.items() if s >= k]
                assert (ids[later] == MASK).all() and seen[later].all()
                # Other steps' [P]s stay hidden; its own block's [P]s are visible.
                assert not (seen & (pseudo == 1) & (step != k)).any()
                assert seen[(pseudo == 1) & (step == k)].all()
                checked += 1
            else:  # a copy of step k: main + copies of steps <= k, no [P]
                assert not (seen & (pseudo == 1)).any()
                np.testing.assert_array_equal(seen & copies, copies & (step <= step[q]))
    assert checked >= 40


def test_loss_scores_ae_and_par_halves_and_feeds_the_mask():
    batch = {k: jnp.asarray(v[:4]) for k, v in _batch().items()}
    objective = pmlm.pmlm()
    kwargs = objective.model_inputs(batch)
    width = batch["masked_ids"].shape[1]
    np.testing.assert_array_equal(
        kwargs["masked_positions"][:, width:], batch[pmlm_data.PSEUDO_POSITIONS]
    )
    assert kwargs["attention_mask"].shape == (4, 64, 64)
    np.testing.assert_array_equal(kwargs["position_ids"], batch["position_ids"])
    vocab = 1000
    right = jax.nn.one_hot(batch["masked_ids"], vocab) * 50.0  # AE half: always right
    outputs = {"mlm_logits": jnp.concatenate([right, jnp.zeros_like(right)], axis=1)}
    loss, metrics = objective.loss_and_metrics(outputs, batch, objective.denominators(batch))
    assert set(metrics) == set(objective.metrics)
    assert float(metrics["ae_accuracy"]) == 1.0 and float(metrics["ae_loss"]) < 1e-6
    np.testing.assert_allclose(float(metrics["par_loss"]), np.log(vocab), rtol=1e-5)
    np.testing.assert_allclose(float(loss), float(metrics["ae_loss"] + metrics["par_loss"]))
    with pytest.raises(ValueError, match="packed batch"):
        objective.model_inputs({**batch, "segment_ids": batch["input_mask"]})
    with pytest.raises(ValueError, match=r"2 x \d+ positions"):
        objective.terms({"mlm_logits": right}, batch)


def test_through_the_model_no_prediction_reads_an_original_it_must_not_see():
    """bert_tiny under the objective's inputs: changing every copied original leaves the AE
    logits and the first step's PAR logits as they were, and moves a later step's."""
    config = cli.model_config_from_gin(
        ["models/bert_tiny.gin"], ["ModelConfig.vocab_size = 1000", "ModelConfig.max_length = 64"]
    )
    model = Transformer(config)
    batch = {k: jnp.asarray(v[:8]) for k, v in _batch().items()}
    objective = pmlm.pmlm()
    inputs = objective.model_inputs(batch)
    params = jax.jit(lambda rng: model.init(rng, **inputs))(jax.random.PRNGKey(0))["params"]
    logits = jax.jit(lambda ids: model.apply({"params": params}, **(inputs | {"input_ids": ids})))
    copies = (batch["pmlm_step"] > 0) & (batch["pmlm_pseudo"] == 0)
    before = np.asarray(logits(batch["input_ids"])["mlm_logits"])
    after = np.asarray(logits(jnp.where(copies, 7, batch["input_ids"]))["mlm_logits"])
    width = batch["masked_ids"].shape[1]
    real = np.asarray(batch["masked_weights"]) > 0
    par_step = np.take_along_axis(
        np.asarray(batch["pmlm_step"]), np.asarray(batch[pmlm_data.PSEUDO_POSITIONS]), axis=1
    )
    moved = np.abs(after - before).max(axis=-1)
    assert (moved[:, :width][real] == 0).all()  # AE: [M] sees no appended token
    assert (moved[:, width:][real & (par_step == 1)] == 0).all()  # step 1: no copy is earlier
    later = real & (par_step >= 2)
    assert later.sum() >= 4 and (moved[:, width:][later] > 0).all()
