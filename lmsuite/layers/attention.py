"""Multi-head dot-product attention over an arbitrary boolean mask plus an additive bias."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lmsuite import partitioning as P
from lmsuite.layers.dense import DenseGeneral, add_bias, default_kernel_init


def masked_softmax(logits_BHLM, mask_B1LM):
    """Softmax over M where masked keys get probability 0.

    A query whose keys are all masked gets all-zero probabilities (not a uniform row, not NaN):
    its output is then the zero vector, which is what DeBERTa's XSoftmax computes for padding.
    """
    logits_BHLM = logits_BHLM.astype(jnp.float32)
    if mask_B1LM is None:
        return jax.nn.softmax(logits_BHLM, axis=-1)
    big_neg = jnp.finfo(jnp.float32).min
    probs = jax.nn.softmax(jnp.where(mask_B1LM, logits_BHLM, big_neg), axis=-1)
    return jnp.where(mask_B1LM, probs, 0.0)


def add_attention_bias(logits_BHLM, bias_BHLM):
    """logits + bias, where the bias is (B, H, L, M) or shared by the batch, (1, H, L, M).

    A shared bias (T5's relative positions) goes through `add_bias`, whose gradient sums the
    batch as a ones-vector matmul: autodiff's reduce over the leading batch dim of the (B, H, L,
    M) score gradients was the slowest op of a T5 training step on XLA:CPU
    (benchmarks/seq2seq_step.py).
    """
    batch = bias_BHLM.shape[0] if bias_BHLM.ndim == 4 else None
    if batch not in (1, logits_BHLM.shape[0]) or bias_BHLM.shape[1:] != logits_BHLM.shape[1:]:
        raise ValueError(
            f"attention bias of shape {tuple(bias_BHLM.shape)} must be (B or 1, H, L, M) = "
            f"({logits_BHLM.shape[0]} or 1, *{tuple(logits_BHLM.shape[1:])})"
        )
    if bias_BHLM.shape[0] == 1:
        return add_bias(logits_BHLM, bias_BHLM[0])
    return logits_BHLM + bias_BHLM


class MultiHeadAttention(nn.Module):
    """Queries from x_BLD attend to keys/values from kv_BMD.

    Submodules `query`, `key`, `value` (D -> H, K) and `out` (H, K -> D). With `scale_logits`
    False the 1/sqrt(K) factor is left to the initialisation, as in T5.
    """

    num_heads: int
    head_dim: int
    use_bias: bool = True
    use_key_bias: bool = True
    scale_logits: bool = True
    dropout_rate: float = 0.0
    init_stddev: float = 0.02
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x_BLD, kv_BMD, *, mask=None, bias_BHLM=None, deterministic: bool = True):
        d_model = x_BLD.shape[-1]
        kw = dict(
            kernel_init=default_kernel_init(self.init_stddev),
            dtype=self.dtype,
            param_dtype=self.param_dtype,
        )
        proj = lambda name, bias: DenseGeneral(
            (self.num_heads, self.head_dim),
            (P.EMBED,),
            (P.HEADS, P.KV),
            use_bias=bias,
            name=name,
            **kw,
        )
        q_BLHK = proj("query", self.use_bias)(x_BLD)
        k_BMHK = proj("key", self.use_bias and self.use_key_bias)(kv_BMD)
        v_BMHK = proj("value", self.use_bias)(kv_BMD)
        if self.scale_logits:
            q_BLHK = q_BLHK / jnp.sqrt(self.head_dim).astype(self.dtype)
        logits_BHLM = jnp.einsum("BLHK,BMHK->BHLM", q_BLHK, k_BMHK)
        if bias_BHLM is not None:
            logits_BHLM = add_attention_bias(logits_BHLM, bias_BHLM)
        probs_BHLM = masked_softmax(logits_BHLM, mask).astype(self.dtype)
        probs_BHLM = nn.Dropout(self.dropout_rate)(probs_BHLM, deterministic=deterministic)
        out_BLHK = jnp.einsum("BHLM,BMHK->BLHK", probs_BHLM, v_BMHK)
        return DenseGeneral(
            (d_model,), (P.HEADS, P.KV), (P.EMBED,), use_bias=self.use_bias, name="out", **kw
        )(out_BLHK)
