"""Position information: learned and sinusoidal absolute tables, T5 relative-position buckets,
Transformer-XL's sinusoidal encodings of relative distances.

DeBERTa's disentangled relative positions live with its attention in `disentangled.py`.
"""

import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from lmsuite import partitioning as P
from lmsuite.layers.dense import default_kernel_init


def sinusoidal_table(num_positions: int, width: int) -> np.ndarray:
    """Vaswani et al.'s table, interleaved as in the paper: PE[p, 2i] = sin(p / 10000^(2i/D)),
    PE[p, 2i+1] = cos(same). Returns float32 (num_positions, width).

    >>> sinusoidal_table(2, 4)[1].round(4)
    array([0.8415, 0.5403, 0.01  , 1.    ], dtype=float32)
    """
    if width % 2:
        raise ValueError(f"sinusoidal positions need an even width, got {width}")
    pos = np.arange(num_positions, dtype=np.float64)[:, None]
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, width, 2, dtype=np.float64) / width))
    table = np.zeros((num_positions, width), dtype=np.float64)
    table[:, 0::2] = np.sin(pos * inv_freq)
    table[:, 1::2] = np.cos(pos * inv_freq)
    return table.astype(np.float32)


def relative_sinusoids(distances_R, width: int) -> jnp.ndarray:
    """Transformer-XL's encoding of relative distances, halves not interleaved:
    out[r] = [sin(d_r f_0), ..., sin(d_r f_{W/2-1}), cos(d_r f_0), ..., cos(d_r f_{W/2-1})] with
    f_i = 10000^(-2i/W). Float32 arithmetic in the reference's order, so that converted models
    match it to rounding. Distances may be negative (keys after the query) or clamped.

    >>> relative_sinusoids(jnp.array([1.0, 0.0]), 4).round(4)
    Array([[0.8415, 0.01  , 0.5403, 1.    ],
           [0.    , 0.    , 1.    , 1.    ]], dtype=float32)
    """
    if width % 2:
        raise ValueError(f"relative sinusoids need an even width, got {width}")
    if distances_R.ndim != 1:
        raise ValueError(f"distances must be a vector, got shape {tuple(distances_R.shape)}")
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, width, 2, dtype=jnp.float32) / width))
    angles_RW = distances_R.astype(jnp.float32)[:, None] * inv_freq[None, :]
    return jnp.concatenate([jnp.sin(angles_RW), jnp.cos(angles_RW)], axis=-1)


def t5_relative_bucket(
    relative_LM: np.ndarray, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> np.ndarray:
    """Mesh-TF/T5's bucketing of key-minus-query distances into `num_buckets` ids.

    Half the buckets (all of them when causal) hold exact distances 0..n/2-1; the rest cover
    distances up to `max_distance` logarithmically; farther distances share the last bucket.
    Bidirectional buckets give keys after the query the upper half of the ids. Causal buckets
    map every key after the query to bucket 0 (the causal mask removes those pairs anyway).
    Arithmetic is float32 as in the reference, so bucket edges agree exactly.

    >>> t5_relative_bucket(np.array([[0, 1, -1, 200]]), bidirectional=True,
    ...                    num_buckets=32, max_distance=128)
    array([[ 0, 17,  1, 31]])
    """
    rel = np.asarray(relative_LM, dtype=np.int64)
    out = np.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        out += (rel > 0).astype(np.int64) * num_buckets
        dist = np.abs(rel)
    else:
        dist = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    scaled = (
        np.log(np.maximum(dist, 1).astype(np.float32) / np.float32(max_exact))
        / np.float32(math.log(max_distance / max_exact))
        * np.float32(num_buckets - max_exact)
    )
    large = np.minimum(max_exact + scaled.astype(np.int64), num_buckets - 1)
    return out + np.where(dist < max_exact, dist, large)


def relative_buckets(num_positions: int, *, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's bidirectional bucket of every key-minus-query distance -(n - 1) .. n - 1, indexed by
    distance + n - 1, so traced position ids can gather their buckets.

    >>> relative_buckets(3, num_buckets=32, max_distance=128)
    array([ 2,  1,  0, 17, 18])
    """
    distance_R = np.arange(-(num_positions - 1), num_positions)
    return t5_relative_bucket(
        distance_R, bidirectional=True, num_buckets=num_buckets, max_distance=max_distance
    )


def position_id_buckets(
    position_ids_BL, *, num_positions: int, num_buckets: int, max_distance: int
):
    """The bidirectional bucket of pos[b, m] - pos[b, l] for every query l and key m: (B, L, L).

    Distances come from the position ids, not the slots, so tokens that share a position (UniLMv2's
    pseudo tokens share their target's) are at distance 0 from each other."""
    lookup_R = jnp.asarray(
        relative_buckets(num_positions, num_buckets=num_buckets, max_distance=max_distance)
    )
    distance_BLM = position_ids_BL[:, None, :] - position_ids_BL[:, :, None]
    return jnp.take(lookup_R, distance_BLM + num_positions - 1)


class RelativePositionBias(nn.Module):
    """T5's learned per-head bias over relative-position buckets, shared by a stack's layers.

    Parameter `rel_embedding` is (R, H). Returns the additive attention bias (1, H, L, M) over
    the slots' distances, or (B, H, L, L) over `position_ids_BL`'s (bidirectional only; ids
    below `max_positions`): UniLMv2's bias (microsoft/unilm s2s-ft `BertModel.rel_pos_bias`, a
    bias-free linear map of the bucket's one-hot, which is this table's row).
    """

    num_heads: int
    num_buckets: int
    max_distance: int
    bidirectional: bool
    max_positions: int = 0  # with position ids: the distances' lookup covers ids 0..max - 1
    init_stddev: float = 0.02
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, q_len: int, k_len: int, *, position_ids_BL=None):
        table_RH = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(default_kernel_init(self.init_stddev), (P.TABLE, P.HEADS)),
            (self.num_buckets, self.num_heads),
            self.param_dtype,
        )
        if position_ids_BL is not None:
            if not self.bidirectional or q_len != k_len or self.max_positions < 1:
                raise ValueError(
                    "a relative bias over position ids is bidirectional self-attention with "
                    f"max_positions >= 1, got bidirectional={self.bidirectional}, q_len={q_len}, "
                    f"k_len={k_len}, max_positions={self.max_positions}"
                )
            bucket_BLM = position_id_buckets(
                position_ids_BL,
                num_positions=self.max_positions,
                num_buckets=self.num_buckets,
                max_distance=self.max_distance,
            )
            bias_BLMH = jnp.take(table_RH, bucket_BLM, axis=0).astype(self.dtype)
            return jnp.transpose(bias_BLMH, (0, 3, 1, 2))
        rel_LM = np.arange(k_len)[None, :] - np.arange(q_len)[:, None]
        bucket_LM = t5_relative_bucket(
            rel_LM,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        # Gathered in float32, then cast: the gradient sums L * M entries into R * H rows, which a
        # bfloat16 scatter-add would round away (`Embed.__call__`).
        bias_LMH = jnp.take(table_RH, jnp.asarray(bucket_LM), axis=0).astype(self.dtype)
        return jnp.transpose(bias_LMH, (2, 0, 1))[None]
