"""Transformer-XL's segment-level recurrence (Dai et al. 2019), as XLNet and Transformer-XL
share it: a segment of L tokens attends over the memory C that each layer kept of the segments
before it, M = C + L keys, addressed by relative distance rather than absolute position.

What the stack needs for that besides its layers and masks (`two_stream`): the encodings of the
distances, the shift from scores over distances to scores over keys, the memory each layer hands
on, and the fixed memory shape a training state carries between steps.
"""

import jax
import jax.numpy as jnp

from lmsuite.layers.positions import relative_sinusoids
from lmsuite.models.config import ModelConfig


def relative_positions(config: ModelConfig, length: int, num_keys: int) -> tuple[jax.Array, ...]:
    """The (R, D) encodings of the distances a query can have to a key, listed from M down:
    bi: M .. -L + 1 (R = M + L); uni: M .. 0 (R = M + 1), clamped to +-clamp_len. Under bi_data
    a second table holds the negated distances for the backward half of the batch."""
    opts = config.xlnet
    end = -length if opts.attn_type == "bi" else -1
    distances_R = jnp.arange(num_keys, end, -1, dtype=jnp.float32)
    if opts.clamp_len > 0:
        distances_R = jnp.clip(distances_R, -opts.clamp_len, opts.clamp_len)
    tables = [relative_sinusoids(distances_R, config.d_model)]
    if opts.bi_data:
        tables.append(relative_sinusoids(-distances_R, config.d_model))
    return tuple(tables)


def relative_shift(scores_BHLR, num_keys: int):
    """Scores against relative distances -> scores against keys: out[..., i, j] =
    scores[..., i, j + L - i]. With distances R listed from M down, entry r of row i is the
    distance M - r, so out[i, j] pairs query i (at C + i) with distance C + i - j.

    The reshape shifts row i left by L - i without a gather (Dai et al. 2019, appendix B).
    Entries whose distance falls outside R (future keys under attn_type="uni") are garbage and
    must be masked by the caller.
    """
    b, h, length, r = scores_BHLR.shape
    shifted = scores_BHLR.reshape(b, h, r, length)[:, :, 1:, :].reshape(b, h, length, r - 1)
    return shifted[..., :num_keys]


def relative_shift_rows(scores_BHQR, rows_BQ, length: int, num_keys: int):
    """`relative_shift` for Q queries at the given positions of a length-L segment:
    out[b, h, q, j] = scores[b, h, q, j + L - rows[b, q]], query q scored as if it were row
    rows[b, q] of the (B, H, L, R) scores. XLNet's query stream has P predictions, far fewer
    than L: scoring them at their own positions costs P/L of placing them at every position.
    Entries past R (future keys under attn_type="uni") repeat the last distance and must be
    masked by the caller, as `relative_shift`'s garbage.
    """
    index_BQM = jnp.arange(num_keys)[None, None, :] + length - rows_BQ[:, :, None]
    return jnp.take_along_axis(scores_BHQR, index_BQM[:, None], axis=-1, mode="clip")


def cache_memory(config: ModelConfig, h_BLD, mem_BCD):
    """The next segment's memory of one layer: the last mem_len states of concat(memory, the
    first reuse_len positions of this layer's input), with no gradient.

    E.g. mem_len=3, reuse_len=2, memory [a, b], input [c, d, e] -> [b, c, d].
    """
    opts = config.xlnet
    current = h_BLD if opts.reuse_len is None else h_BLD[:, : opts.reuse_len]
    states = current if mem_BCD is None else jnp.concatenate([mem_BCD, current], axis=1)
    if opts.mem_len is not None:
        states = states[:, -opts.mem_len :]
    return jax.lax.stop_gradient(states)


def memory_shapes(config: ModelConfig, batch_size: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    """The memory a training state carries from step to step: one (B, mem_len, D) array per
    layer, in the compute dtype. With memory of that shape `new_mems` has it too, so the state
    keeps one shape; the first step's memory is zeros, as the reference's `init_mems`.

    Raises:
      ValueError: no fixed `XLNetOptions.mem_len` (`families.memory_shapes` refuses other
        families first).
    """
    if config.xlnet.mem_len is None:
        raise ValueError(
            "a training state needs a fixed memory: set XLNetOptions.mem_len (the reference "
            "pretrains with 384 for seq_len 512), got None"
        )
    shape = (batch_size, config.xlnet.mem_len, config.d_model)
    return tuple(
        jax.ShapeDtypeStruct(shape, config.compute_dtype) for _ in range(config.num_layers)
    )
