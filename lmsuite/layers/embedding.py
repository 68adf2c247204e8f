"""Token (and any other lookup-table) embeddings, with `attend` for tied output projections."""

import math

import flax.linen as nn
import jax.numpy as jnp

from lmsuite.layers.dense import default_kernel_init


class Embed(nn.Module):
    """A (num_embeddings, features) lookup table whose rows carry `row_name` as logical axis."""

    num_embeddings: int
    features: int
    row_name: str
    col_name: str
    init_stddev: float = 0.02
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(
                default_kernel_init(self.init_stddev), (self.row_name, self.col_name)
            ),
            (self.num_embeddings, self.features),
            self.param_dtype,
        )

    def __call__(self, ids):
        # Gather in the parameter dtype, then cast: the gradient's scatter-add then sums a
        # frequent row's many contributions in float32, not bfloat16 (whose 8-bit mantissa
        # drops an addend once the sum is ~256x larger).
        return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

    def attend(self, x_BLE):
        """Scores every row against `x`: the tied output projection (…, E) -> (…, V)."""
        table_VE = jnp.asarray(self.embedding, self.dtype)
        # As one rank-2 matmul over N = all leading positions: XLA:CPU's fast path (model_step.py).
        lead = x_BLE.shape[:-1]
        x_NE = jnp.asarray(x_BLE, self.dtype).reshape(math.prod(lead), x_BLE.shape[-1])
        return jnp.einsum("NE,VE->NV", x_NE, table_VE).reshape(*lead, table_VE.shape[0])
