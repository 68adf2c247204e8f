"""Norms at bfloat16 compute their statistics in float32.

An activation with a large common offset (a residual stream late in training) loses its
variance to cancellation if mean and variance are taken in bf16, whose 8 significant bits
round 100 +- 1 to steps of 0.5. `make_norm` promises float32 statistics whatever the compute
dtype (flax's norms promote to at least float32); these tests hold it to that.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.layers.norm import make_norm

U = 2.0**-8  # bfloat16 has 8 significant bits: rounding to nearest is off by at most U|x|


def _offset_rows():
    x = 100.0 + np.random.default_rng(0).normal(size=(4, 64))
    return jnp.asarray(x, jnp.bfloat16)  # exact in bf16 from here on


def _bf16_statistics_layernorm(x):
    """What a norm that kept the statistics in bf16 would return (the failure these catch)."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + jnp.asarray(1e-6, x.dtype))


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_bf16_norm_is_the_float32_norm_rounded(norm_type):
    x_bf16 = _offset_rows()
    kw = dict(eps=1e-6, name="norm")
    f32 = make_norm(norm_type, **kw)
    bf16 = make_norm(norm_type, dtype=jnp.bfloat16, **kw)
    params = f32.init(jax.random.PRNGKey(0), x_bf16.astype(jnp.float32))
    ref = np.asarray(f32.apply(params, x_bf16.astype(jnp.float32)), np.float64)
    got = bf16.apply(params, x_bf16)
    assert got.dtype == jnp.bfloat16
    # One rounding of the output: within U of each value's magnitude.
    error = np.abs(np.asarray(got, np.float64) - ref)
    assert (error <= U * np.abs(ref) + 1e-6).all(), error.max()


def test_bf16_statistics_would_fail_the_bound():
    x_bf16 = _offset_rows()
    f32 = make_norm("layernorm", eps=1e-6, name="norm")
    params = f32.init(jax.random.PRNGKey(0), x_bf16.astype(jnp.float32))
    ref = np.asarray(f32.apply(params, x_bf16.astype(jnp.float32)), np.float64)
    bad = np.asarray(_bf16_statistics_layernorm(x_bf16), np.float64)
    assert (np.abs(bad - ref) > U * np.abs(ref) + 1e-6).any()
