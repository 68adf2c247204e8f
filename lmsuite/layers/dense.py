"""Dense projections whose parameters carry logical axis names."""

from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp

Initializer = nn.initializers.Initializer


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
        # Contract the trailing n_in dims of x with the leading n_in dims of the kernel.
        y = jnp.tensordot(x, kernel, axes=(tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in))))
        if self.use_bias:
            bias = self.param(
                "bias",
                nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(self.out_names)),
                tuple(self.features),
                self.param_dtype,
            )
            bias = jnp.asarray(bias, self.dtype)
            y = y + bias.reshape((1,) * (y.ndim - bias.ndim) + bias.shape)
        return y


def dense(features: int, in_name: str, out_name: str, **kwargs) -> DenseGeneral:
    """A plain (…, in) -> (…, features) projection."""
    return DenseGeneral(features=(features,), in_names=(in_name,), out_names=(out_name,), **kwargs)
