"""Lookup tables in a bfloat16 model keep a float32 gradient sum.

A table's gradient is a scatter-add of every position's cotangent into its row. Summed in
bfloat16 (8-bit mantissa), a row stops growing once its sum is ~256x an addend: a frequent
token's embedding, or a T5 bucket shared by thousands of (query, key) pairs, would get a
gradient that is mostly rounding. The lookups gather float32 rows and cast after, so the sum is
float32 whatever the compute dtype. Cotangents of ones make the exact gradient a count.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.layers.embedding import Embed
from lmsuite.layers.positions import RelativePositionBias, t5_relative_bucket


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_embedding_gradient_counts_every_occurrence(dtype):
    ids = jnp.asarray([0] * 4096 + [1] * 3, jnp.int32)  # row 0 far past bfloat16's 256
    embed = Embed(num_embeddings=4, features=8, row_name="vocab", col_name="embed", dtype=dtype)
    params = nn.unbox(embed.init(jax.random.PRNGKey(0), ids))

    def total(p):
        out = embed.apply(p, ids)
        assert out.dtype == dtype
        return jnp.sum(out.astype(jnp.float32))

    grad = jax.grad(total)(params)["params"]["embedding"]
    assert grad.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(grad[:, 0]), [4096.0, 3.0, 0.0, 0.0])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_relative_bias_gradient_counts_every_pair(dtype):
    length, buckets, heads = 128, 32, 2
    bias = RelativePositionBias(
        num_heads=heads, num_buckets=buckets, max_distance=128, bidirectional=True, dtype=dtype
    )
    params = nn.unbox(bias.init(jax.random.PRNGKey(0), length, length))

    def total(p):
        out = bias.apply(p, length, length)
        assert out.dtype == dtype
        return jnp.sum(out.astype(jnp.float32))

    grad = jax.grad(total)(params)["params"]["rel_embedding"]
    relative = np.arange(length)[None, :] - np.arange(length)[:, None]
    bucket = t5_relative_bucket(relative, bidirectional=True, num_buckets=buckets, max_distance=128)
    counts = np.bincount(bucket.ravel(), minlength=buckets).astype(np.float32)
    assert counts.max() > 1024  # a bucket a bfloat16 sum would have rounded
    np.testing.assert_array_equal(np.asarray(grad), np.repeat(counts[:, None], heads, axis=1))
