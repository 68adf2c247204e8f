"""A tiny model, MLM batches and a sharded step builder shared by the training tests."""

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite import partitioning
from lmsuite.models import ModelConfig, Transformer
from lmsuite.objectives import mlm
from lmsuite.training import optimizers, step, train_state

CONFIG = ModelConfig(
    architecture="encoder",
    vocab_size=128,
    d_model=32,
    num_heads=2,
    d_ff=64,
    num_layers=2,
    max_length=64,
    type_vocab_size=2,
    heads=("mlm",),
)
MASK_ID = 4


def mlm_batch(
    *, batch_size: int = 8, length: int = 16, predictions: int = 4, seed: int = 0, dense=False
) -> dict[str, np.ndarray]:
    """A random MLM batch as EncoderMlmFeatureConverter emits it, with padding and some unused
    prediction slots; `dense=True` gives the same predictions as (B, L) targets and weights
    instead (SeqIO EncoderFeatureConverter style, logits at every position)."""
    rs = np.random.RandomState(seed)
    ids = rs.randint(5, CONFIG.vocab_size, (batch_size, length)).astype(np.int32)
    lengths = rs.randint(length // 2, length + 1, (batch_size,))
    real = np.arange(length)[None, :] < lengths[:, None]
    positions = np.stack([rs.permutation(n)[:predictions] for n in lengths]).astype(np.int32)
    weights = (rs.rand(batch_size, predictions) < 0.8).astype(np.float32)
    weights[:, 0] = 1.0
    targets = np.take_along_axis(ids, positions, axis=1) * (weights > 0)
    inputs = np.where(real, ids, 0).astype(np.int32)
    for row, (row_positions, row_weights) in enumerate(zip(positions, weights, strict=True)):
        inputs[row, row_positions[row_weights > 0]] = MASK_ID
    if dense:
        targets_bl = np.zeros_like(inputs)
        weights_bl = np.zeros(inputs.shape, np.float32)
        for row in range(batch_size):
            used = weights[row] > 0
            targets_bl[row, positions[row][used]] = targets[row][used]
            weights_bl[row, positions[row][used]] = 1.0
        return {
            "input_ids": inputs,
            "input_mask": real.astype(np.int32),
            "encoder_target_tokens": targets_bl,
            "encoder_loss_weights": weights_bl,
        }
    return {
        "input_ids": inputs,
        "token_type_ids": np.zeros_like(inputs),
        "input_mask": real.astype(np.int32),
        "masked_positions": positions,
        "masked_ids": targets.astype(np.int32),
        "masked_weights": weights,
    }


def build(
    *,
    mesh,
    config=CONFIG,
    optimizer="adamw",
    lr=1e-3,
    num_microbatches=1,
    skip_nonfinite=False,
    batch=None,
    seed=0,
):
    """(state, jitted_step, batch_shardings, state_shardings) for `config` on `mesh`."""
    model = Transformer(config)
    batch = mlm_batch() if batch is None else batch

    def init_params(rng):
        return model.init({"params": rng}, jnp.zeros((1, 8), jnp.int32))["params"]

    tx = optimizers.make_optimizer(name=optimizer, learning_rate=lr, clip_norm=1.0)
    state, shardings, _ = train_state.create_sharded_state(
        init_params=init_params, tx=tx, mesh=mesh, rng=jax.random.PRNGKey(seed)
    )
    batch_sharding = step.batch_shardings(
        jax.eval_shape(lambda: batch), mesh, rules=partitioning.DEFAULT_RULES
    )
    run = step.jit_train_step(
        apply_fn=model.apply,
        objective=mlm(),
        learning_rate_fn=lambda s: lr,
        state_shardings=shardings,
        batch_sharding=batch_sharding,
        mesh=mesh,
        num_microbatches=num_microbatches,
        skip_nonfinite=skip_nonfinite,
    )
    return state, run, batch_sharding, shardings
