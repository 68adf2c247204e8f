"""Losses take bfloat16 logits (a bf16 model's head) and compute in float32.

A log-sum-exp over a vocabulary in bf16 rounds each partial sum to 8 significant bits, enough
to move a per-token loss by a few hundredths; summed over a batch that is a visible bias. The
losses upcast the logits first, so bf16 logits give exactly the float32 loss of the same values.
"""

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.objectives.base import token_cross_entropy
from lmsuite.objectives.rtd import binary_cross_entropy
from lmsuite.objectives.seq2seq import smoothed_cross_entropy


def _logits(shape):
    return jnp.asarray(3.0 * np.random.default_rng(0).normal(size=shape), jnp.bfloat16)


def test_token_cross_entropy_of_bf16_logits_is_the_float32_loss():
    logits = _logits((4, 8, 1000))
    targets = jnp.asarray(np.random.default_rng(1).integers(0, 1000, (4, 8)), jnp.int32)
    weights = jnp.ones((4, 8), jnp.float32)
    got = token_cross_entropy(logits, targets, weights)
    ref = token_cross_entropy(logits.astype(jnp.float32), targets, weights)
    assert got.loss.dtype == jnp.float32
    assert float(got.loss) == float(ref.loss) and float(got.correct) == float(ref.correct)
    # What computing in bf16 would give: far from the float32 value, so the equality above
    # is what tells the two apart.
    in_bf16 = jnp.sum(
        jax.nn.logsumexp(logits, axis=-1)
        - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    )
    assert abs(float(in_bf16) - float(ref.loss)) > 1e-3 * abs(float(ref.loss))


def test_seq2seq_and_binary_losses_of_bf16_logits_are_the_float32_losses():
    logits = _logits((2, 5, 300))
    targets = jnp.asarray(np.random.default_rng(2).integers(0, 300, (2, 5)), jnp.int32)
    got = smoothed_cross_entropy(logits, targets, label_smoothing=0.1, z_loss=1e-4)
    ref = smoothed_cross_entropy(
        logits.astype(jnp.float32), targets, label_smoothing=0.1, z_loss=1e-4
    )
    for a, b in zip(got, ref, strict=True):
        assert a.dtype == jnp.float32
        np.testing.assert_array_equal(a, b)
    scores = logits[..., 0]
    labels = jnp.asarray(np.random.default_rng(3).integers(0, 2, (2, 5)))
    weights = jnp.ones((2, 5), jnp.float32)
    got = binary_cross_entropy(scores, labels, weights)
    ref = binary_cross_entropy(scores.astype(jnp.float32), labels, weights)
    assert jax.tree.map(float, got) == jax.tree.map(float, ref)
