"""Multi-head dot-product attention over an arbitrary boolean mask plus an additive bias.

Decoding keeps a key/value cache as explicit arrays passed in and returned, not as a Flax
"cache" collection: a stack that shares one block between its layers (ALBERT-style sharing)
needs one cache per application of that block, which a per-module variable cannot hold.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from lmsuite import partitioning as P
from lmsuite.layers import fused_attention
from lmsuite.layers.dense import DenseGeneral, add_bias, default_kernel_init
from lmsuite.layers.masks import MaskLayout


def attention_scores(spec: str, a, b, *, float32: bool = True):
    """`jnp.einsum(spec, a, b)` accumulated and returned in float32, whatever the inputs' dtype
    (`ModelConfig.float32_scores`; with `float32=False`, in the inputs' dtype).

    Scores are the activation bfloat16 cannot hold. Near initialisation a query's scores are
    almost equal across keys, and the differences from which attention learns which key to read
    fall below bfloat16's 8-bit mantissa: rounded, they left bert_multitask_tiny's MLM on the
    unigram plateau at two seeds of four; with float32 scores those two leave it as float32
    models do (benchmarks/RESULTS.md, "attention scores in float32"). Fused kernels (splash,
    flash, cuDNN) keep scores in float32 too, so the plain path computes what they do; the
    scores' gradient then stays float32 down to the query and key projections. Rounded scores
    (T5X's `float32_logits=False`, MaxText's `float32_qk_product=False`) move fewer bytes where
    XLA writes the scores out; on a TPU it mostly keeps them inside one fusion, so the
    projected saving is small (benchmarks/RESULTS.md).
    """
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32 if float32 else None)


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


def probabilities(logits_BHLM, mask_B1LM, dtype):
    """`masked_softmax` computed in float32 and returned in `dtype`.

    In a lower precision the backward pass keeps only these `dtype` probabilities, not the
    float32 ones autodiff would save: the gradient p * (g - sum(g * p)) is formed in float32
    from them. On a TPU the (B, H, L, M) residual and its gradient are the largest tensors of
    the plain attention path, so this halves its HBM traffic (`lmsuite compile`'s per-op
    projection shows it); float32 takes the autodiff path unchanged.
    """
    if jnp.dtype(dtype) == jnp.float32:
        return masked_softmax(logits_BHLM, mask_B1LM)
    if mask_B1LM is None:
        return _low_precision_softmax(logits_BHLM, dtype)
    return _low_precision_masked_softmax(logits_BHLM, mask_B1LM, dtype)


def _softmax_backward(probs, g):
    p, g = probs.astype(jnp.float32), g.astype(jnp.float32)
    return p * (g - jnp.sum(g * p, axis=-1, keepdims=True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _low_precision_softmax(logits_BHLM, dtype):
    return masked_softmax(logits_BHLM, None).astype(dtype)


def _low_precision_softmax_fwd(logits_BHLM, dtype):
    probs = _low_precision_softmax(logits_BHLM, dtype)
    return probs, (probs, jnp.zeros((), logits_BHLM.dtype))


def _low_precision_softmax_bwd(dtype, residual, g):
    probs, like = residual
    return (_softmax_backward(probs, g).astype(like.dtype),)


_low_precision_softmax.defvjp(_low_precision_softmax_fwd, _low_precision_softmax_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _low_precision_masked_softmax(logits_BHLM, mask_B1LM, dtype):
    return masked_softmax(logits_BHLM, mask_B1LM).astype(dtype)


def _low_precision_masked_softmax_fwd(logits_BHLM, mask_B1LM, dtype):
    probs = _low_precision_masked_softmax(logits_BHLM, mask_B1LM, dtype)
    return probs, (probs, jnp.zeros((), logits_BHLM.dtype))


def _low_precision_masked_softmax_bwd(dtype, residual, g):
    probs, like = residual
    return _softmax_backward(probs, g).astype(like.dtype), None  # masked keys: p = 0


_low_precision_masked_softmax.defvjp(
    _low_precision_masked_softmax_fwd, _low_precision_masked_softmax_bwd
)


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


def init_kv_cache(batch: int, length: int, num_heads: int, head_dim: int, dtype) -> dict:
    """An empty self-attention cache: `key` and `value`, each (B, M, H, K) zeros."""
    zeros_BMHK = jnp.zeros((batch, length, num_heads, head_dim), dtype)
    return {"key": zeros_BMHK, "value": zeros_BMHK}


class MultiHeadAttention(nn.Module):
    """Queries from x_BLD attend to keys/values from kv_BMD.

    Submodules `query`, `key`, `value` (D -> H, K) and `out` (H, K -> D). Logits are divided by
    sqrt(scale_factor * K): TUPE (`untied_positions.py`) sets scale_factor 2, its content and
    positional terms each taking half the variance. With `scale_logits` False the factor is
    left to the initialisation, as in T5.

    With a `cache` (a dict of `key` and `value`, each (B, M, H, K)) the call returns
    (output, new cache), in one of two ways:
      self-attention (`cache_index` given): the keys/values of the L new positions are written
        at [cache_index, cache_index + L) and the queries attend to all M cached positions, so
        `mask` must be (B or 1, 1, L, M) and hide the positions not yet written.
      memory (`cache_index` None, cross-attention): with kv_BMD given its keys/values replace
        the cache (the first decoding step); with kv_BMD None the cached ones are used, so the
        encoder's output is projected once per generation, not once per token.
    """

    num_heads: int
    head_dim: int
    use_bias: bool = True
    use_key_bias: bool = True
    scale_logits: bool = True
    scale_factor: float = 1.0
    dropout_rate: float = 0.0
    init_stddev: float = 0.02
    float32_scores: bool = True  # `attention_scores`
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "plain"

    @nn.compact
    def __call__(
        self,
        x_BLD,
        kv_BMD,
        *,
        mask=None,
        bias_BHLM=None,
        deterministic: bool = True,
        cache=None,
        cache_index=None,
        mask_layout: MaskLayout | None = None,
    ):
        if self.attention_impl not in fused_attention.IMPLEMENTATIONS:
            raise ValueError(
                f"attention_impl must be one of {fused_attention.IMPLEMENTATIONS}, "
                f"got {self.attention_impl!r}"
            )
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
        if kv_BMD is not None:
            k_BMHK = proj("key", self.use_bias and self.use_key_bias)(kv_BMD)
            v_BMHK = proj("value", self.use_bias)(kv_BMD)
        elif cache is None or cache_index is not None:
            raise ValueError("kv_BMD may be None only with a memory cache (cache_index None)")
        else:
            k_BMHK, v_BMHK = cache["key"], cache["value"]
        if cache is not None and cache_index is not None:
            k_BMHK, v_BMHK = (
                jax.lax.dynamic_update_slice(
                    cache[name], new.astype(cache[name].dtype), (0, cache_index, 0, 0)
                )
                for name, new in (("key", k_BMHK), ("value", v_BMHK))
            )
        if self.scale_logits:
            q_BLHK = q_BLHK / jnp.sqrt(self.scale_factor * self.head_dim).astype(self.dtype)
        project_out = lambda out_BLHK: DenseGeneral(
            (d_model,), (P.HEADS, P.KV), (P.EMBED,), use_bias=self.use_bias, name="out", **kw
        )(out_BLHK)
        if self.attention_impl != "plain":
            reason = fused_attention.plain_reason(
                dropout=self.dropout_rate > 0 and not deterministic,
                bias=bias_BHLM is not None,
                cache=cache is not None,
                mask=mask is not None,
                layout=mask_layout,
                sow=self.is_mutable_collection("intermediates"),
            )
            if not reason:
                out_BLHK = fused_attention.fused_attention(
                    q_BLHK,
                    k_BMHK,
                    v_BMHK,
                    mask_layout,
                    interpret=self.attention_impl == "fused_interpret",
                )
                return project_out(out_BLHK)
            fused_attention.log_plain_once(reason)
        logits_BHLM = attention_scores(
            "BLHK,BMHK->BHLM", q_BLHK, k_BMHK, float32=self.float32_scores
        )
        if bias_BHLM is not None:
            logits_BHLM = add_attention_bias(logits_BHLM, bias_BHLM)
        probs_BHLM = probabilities(logits_BHLM, mask, self.dtype)
        # Kept only when applied with mutable=["intermediates"] (`LoadedModel.attention`).
        self.sow("intermediates", "attention_weights", probs_BHLM)
        probs_BHLM = nn.Dropout(self.dropout_rate)(probs_BHLM, deterministic=deterministic)
        out_BLHK = jnp.einsum("BHLM,BMHK->BLHK", probs_BHLM, v_BMHK)
        if cache is None:
            return project_out(out_BLHK)
        return project_out(out_BLHK), {"key": k_BMHK, "value": v_BMHK}
