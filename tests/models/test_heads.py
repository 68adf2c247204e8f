"""`heads.Classifier` computes in float32 under a bfloat16 model: its logits and gradients equal
the float32 computation on the same (bfloat16) encoder states."""

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.models import ModelConfig
from lmsuite.models.heads import Classifier

D = 32


def _config(dtype: str) -> ModelConfig:
    return ModelConfig(
        architecture="encoder",
        vocab_size=50,
        d_model=D,
        num_heads=2,
        d_ff=48,
        num_layers=1,
        max_length=16,
        num_labels=3,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        dtype=dtype,
    )


def test_a_bfloat16_models_classifier_runs_in_float32():
    rng = np.random.default_rng(0)
    # The encoder's states as a bfloat16 model hands them over; an offset shared by every row,
    # as a [CLS] state has, so the rows differ by little against their size.
    states = (3.0 + 0.01 * rng.standard_normal((64, 4, D))).astype(jnp.bfloat16)
    labels = jnp.asarray(rng.integers(0, 3, 64))
    head16, head32 = Classifier(_config("bfloat16")), Classifier(_config("float32"))
    params = head32.init(jax.random.PRNGKey(0), jnp.asarray(states, jnp.float32))["params"]

    def loss(head):
        def f(p):
            logits = head.apply({"params": p}, states)
            picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)
            return -picked.mean(), logits

        return jax.value_and_grad(f, has_aux=True)(params)

    (loss16, logits16), grads16 = loss(head16)
    (loss32, logits32), grads32 = loss(head32)
    assert logits16.dtype == jnp.float32
    np.testing.assert_array_equal(logits16, logits32)
    np.testing.assert_array_equal(loss16, loss32)
    float32_grads = dict(jax.tree_util.tree_leaves_with_path(grads32))
    for path, g16 in jax.tree_util.tree_leaves_with_path(grads16):
        np.testing.assert_array_equal(g16, float32_grads[path], err_msg=jax.tree_util.keystr(path))
