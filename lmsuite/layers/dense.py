"""Dense projections whose parameters carry logical axis names."""

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Initializer = nn.initializers.Initializer


def add_bias(y, bias):
    """y + bias over y's trailing dims: (…, *S), S -> (…, *S).

    The same value as `y + bias`; only the gradient is computed differently. Autodiff sums the
    bias gradient with a reduce over the leading dims, which XLA:CPU runs several times slower
    than the same sum written as a ones-vector matmul (26 vs 1.6 ms for the MLM head's (B P, V)
    vocabulary bias gradient, ~5% of a BERT training step; benchmarks/model_step.py).

    >>> add_bias(jnp.zeros((2, 3)), jnp.array([1.0, 2.0, 3.0]))
    Array([[1., 2., 3.],
           [1., 2., 3.]], dtype=float32)
    """
    if bias.ndim > y.ndim or y.shape[y.ndim - bias.ndim :] != bias.shape:
        raise ValueError(
            f"bias of shape {tuple(bias.shape)} must match the trailing dims of {tuple(y.shape)}"
        )
    return _add_trailing_bias(y, bias)


@jax.custom_vjp
def _add_trailing_bias(y, bias):
    return y + bias.reshape((1,) * (y.ndim - bias.ndim) + bias.shape)


def _add_trailing_bias_fwd(y, bias):
    # The zero-size arrays carry the dtypes and bias rank into the backward pass.
    return _add_trailing_bias(y, bias), (
        jnp.zeros((0,), y.dtype),
        jnp.zeros((0,) * bias.ndim, bias.dtype),
    )


def _add_trailing_bias_bwd(residuals, g):
    y_like, bias_like = residuals
    bias_shape = g.shape[g.ndim - bias_like.ndim :]
    g_NS = g.reshape(-1, math.prod(bias_shape))
    ones_N = jnp.ones((g_NS.shape[0],), g.dtype)
    g_bias = jnp.dot(ones_N, g_NS, preferred_element_type=jnp.float32).reshape(bias_shape)
    return g.astype(y_like.dtype), g_bias.astype(bias_like.dtype)


_add_trailing_bias.defvjp(_add_trailing_bias_fwd, _add_trailing_bias_bwd)


def default_kernel_init(stddev: float) -> Initializer:
    """Truncated normal, as BERT and its descendants initialise every weight."""
    return nn.initializers.truncated_normal(stddev=stddev)


class DenseGeneral(nn.Module):
    """A dense layer over the last `len(in_axes)` input dims with logically named parameters.

    `features` is the output shape; `in_names`/`out_names` are the logical names of the
    contracted and produced dims, e.g. D -> (H, K) is in_names=("embed",),
    out_names=("heads", "kv").
    """

    features: Sequence[int]
    in_names: Sequence[str]
    out_names: Sequence[str]
    use_bias: bool = True
    kernel_init: Initializer = default_kernel_init(0.02)
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        n_in = len(self.in_names)
        in_shape = x.shape[-n_in:]
        kernel = self.param(
            "kernel",
            nn.with_logical_partitioning(self.kernel_init, (*self.in_names, *self.out_names)),
            (*in_shape, *self.features),
            self.param_dtype,
        )
        x = jnp.asarray(x, self.dtype)
        kernel = jnp.asarray(kernel, self.dtype)
        # Contract the trailing n_in dims of x with the leading n_in dims of the kernel as one
        # rank-2 matmul: XLA:CPU runs rank-2 dots (and their gradients) on its fast path, and a
        # BERT training step ran ~7% faster than with a multi-dim tensordot (model_step.py).
        lead = x.shape[: x.ndim - n_in]
        n_rows, n_inner, n_out = math.prod(lead), math.prod(in_shape), math.prod(self.features)
        y = jnp.dot(x.reshape(n_rows, n_inner), kernel.reshape(n_inner, n_out))
        y = y.reshape(*lead, *self.features)
        if self.use_bias:
            bias = self.param(
                "bias",
                nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(self.out_names)),
                tuple(self.features),
                self.param_dtype,
            )
            y = add_bias(y, jnp.asarray(bias, self.dtype))
        return y
