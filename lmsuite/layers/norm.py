"""LayerNorm and RMSNorm with logically named parameters."""

import flax.linen as nn
import jax.numpy as jnp

from lmsuite import partitioning as P

NORM_TYPES = ("layernorm", "rmsnorm")


def make_norm(
    norm_type: str,
    *,
    eps: float,
    name: str,
    use_bias: bool = True,
    dtype: jnp.dtype = jnp.float32,
    param_dtype: jnp.dtype = jnp.float32,
) -> nn.Module:
    """Returns a LayerNorm (scale and optional bias) or an RMSNorm (scale only, as in T5).

    Both normalise in float32 whatever the compute dtype, as T5 and HF do: flax's norms take
    mean and variance in at least float32 and round only the output to `dtype`, since bf16
    statistics of an offset activation lose its variance to cancellation
    (tests/layers/test_norm.py holds them to it).
    """
    scale_init = nn.with_logical_partitioning(nn.initializers.ones_init(), (P.EMBED,))
    if norm_type == "layernorm":
        return nn.LayerNorm(
            epsilon=eps,
            use_bias=use_bias,
            scale_init=scale_init,
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (P.EMBED,)),
            dtype=dtype,
            param_dtype=param_dtype,
            name=name,
        )
    if norm_type == "rmsnorm":
        return nn.RMSNorm(
            epsilon=eps, scale_init=scale_init, dtype=dtype, param_dtype=param_dtype, name=name
        )
    raise ValueError(f"norm_type must be one of {NORM_TYPES}, got {norm_type!r}")
