"""Output heads: vocabulary (MLM with transform, LM), pooled classifier, ELECTRA's RTD."""

import flax.linen as nn
import jax.numpy as jnp

from lmsuite import partitioning as P
from lmsuite.layers.dense import DenseGeneral, add_bias, default_kernel_init
from lmsuite.layers.mlp import activation_fn
from lmsuite.layers.norm import make_norm
from lmsuite.models.config import ModelConfig


def gather_positions(x_BLD, positions_BP):
    """Rows of x at the given positions: (B, L, D), (B, P) -> (B, P, D).

    >>> gather_positions(jnp.arange(6.0).reshape(1, 3, 2), jnp.array([[2, 0]]))
    Array([[[4., 5.], [0., 1.]]], dtype=float32)
    """
    if positions_BP.ndim != 2 or positions_BP.shape[0] != x_BLD.shape[0]:
        raise ValueError(
            f"masked_positions must be (batch={x_BLD.shape[0]}, P), got {tuple(positions_BP.shape)}"
        )
    return jnp.take_along_axis(x_BLD, positions_BP[:, :, None].astype(jnp.int32), axis=1)


class VocabHead(nn.Module):
    """x_B?D -> logits_B?V. With `transform` (BERT's MLM head): dense D -> E, activation, norm.

    The output projection is the token table (tied) or `output_projection` (E, V), plus
    `output_bias` (V,) when config.output_bias.
    """

    config: ModelConfig
    token_embedder: nn.Module
    transform: bool

    @nn.compact
    def __call__(self, x_BLD):
        cfg = self.config
        dtype = cfg.compute_dtype
        kinit = default_kernel_init(cfg.init_stddev)
        x = x_BLD
        if self.transform:
            x = DenseGeneral(
                (cfg.embed_width,),
                (P.EMBED,),
                (P.MLP,),
                kernel_init=kinit,
                dtype=dtype,
                name="transform",
            )(x)
            x = activation_fn(cfg.mlm_activation)(x)
            x = make_norm(cfg.norm_type, eps=cfg.norm_eps, dtype=dtype, name="transform_norm")(x)
            # An embedding-space activation, constrained like the block outputs. Left to
            # propagation, the backward pass of the vocabulary projection came out of XLA's SPMD
            # partitioner (jax 0.10.2) O(1) wrong on (data, fsdp, tensor) meshes; the canary in
            # tests/training/test_mesh_gradients.py says when that is fixed.
            x = nn.with_logical_constraint(x, (P.BATCH, P.LENGTH, P.EMBED))
        if cfg.tie_embeddings:
            if cfg.scale_tied_output:
                x = x * jnp.asarray(cfg.d_model**-0.5, dtype)
            logits = self.token_embedder.attend(x)
        else:
            logits = DenseGeneral(
                (cfg.vocab_size,),
                (P.EMBED,),
                (P.VOCAB,),
                use_bias=False,
                kernel_init=kinit,
                dtype=dtype,
                name="output_projection",
            )(x)
        if cfg.output_bias:
            bias_V = self.param(
                "output_bias",
                nn.with_logical_partitioning(nn.initializers.zeros_init(), (P.VOCAB,)),
                (cfg.vocab_size,),
            )
            logits = add_bias(logits, jnp.asarray(bias_V, dtype))
        return logits


POOLINGS = ("first", "mean", "last")


def pool_states(x_BLD, mask_BL, pooling: str):
    """One state per row: "first" x[:, 0] (BERT's [CLS]); "mean" the mean over the positions
    `mask_BL` marks (Sentence-T5's encoder pooling); "last" the state at the last marked
    position, wherever the padding lies (GPT's extract token, XLNet's final <cls>).

    Example: x rows [a, b, c], mask [1, 1, 0] -> first a, mean (a + b) / 2, last b;
      mask [0, 1, 1] (padded on the left) -> last c.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if pooling == "first":
        return x_BLD[:, 0]
    if mask_BL is None or tuple(mask_BL.shape) != tuple(x_BLD.shape[:2]):
        got = None if mask_BL is None else tuple(mask_BL.shape)
        raise ValueError(f"pooling={pooling!r} needs mask_BL {tuple(x_BLD.shape[:2])}, got {got}")
    real_BL = mask_BL > 0
    if pooling == "mean":
        weights_BL = real_BL.astype(jnp.float32)
        total_BD = jnp.einsum("BLD,BL->BD", x_BLD.astype(jnp.float32), weights_BL)
        count_B1 = jnp.maximum(weights_BL.sum(axis=1, keepdims=True), 1.0)
        return (total_BD / count_B1).astype(x_BLD.dtype)
    # argmax finds the first marked position of the reversed row: the last one of the row.
    last_B = x_BLD.shape[1] - 1 - jnp.argmax(real_BL[:, ::-1], axis=1)
    return jnp.take_along_axis(x_BLD, last_B[:, None, None], axis=1)[:, 0]


class Classifier(nn.Module):
    """The first token's state -> `pooler` (dense + tanh) -> `output` (num_labels logits).

    BERT's NSP, ALBERT's SOP, StructBERT's 3-way pairs and fine-tuning probes all use it, as do
    a multi-task encoder's row-level `LabelHead`s (`num_labels` set: their own arity).
    `pooling` other than "first" (`pool_states`, given `mask_BL`) is how the fine-tuning probes
    read the families without a [CLS] token (`lmsuite.evaluation.probe_models`).

    It computes in float32 whatever `compute_dtype` is: a row-level label's gradient is a small
    difference between the classes' pooled states, and bfloat16 rounding of the pooler's input
    and activations is of its order (benchmarks/RESULTS.md, "The sentence heads in bf16": in
    float32 the head's gradient error against a float32 model drops by about half). It costs
    two (B, D) matmuls.
    """

    config: ModelConfig
    num_labels: int | None = None  # default: config.num_labels
    pooling: str = "first"

    @nn.compact
    def __call__(self, x_BLD, *, mask_BL=None, deterministic=True):
        cfg = self.config
        labels = cfg.num_labels if self.num_labels is None else self.num_labels
        kw = dict(kernel_init=default_kernel_init(cfg.init_stddev), dtype=jnp.float32)
        pooled_BD = jnp.tanh(
            DenseGeneral((cfg.d_model,), (P.EMBED,), (P.MLP,), name="pooler", **kw)(
                pool_states(x_BLD, mask_BL, self.pooling).astype(jnp.float32)
            )
        )
        pooled_BD = nn.Dropout(cfg.dropout_rate)(pooled_BD, deterministic=deterministic)
        return DenseGeneral((labels,), (P.EMBED,), (P.TABLE,), name="output", **kw)(pooled_BD)


class TokenClassifier(nn.Module):
    """Every token's state -> dropout -> `output` (num_labels logits per token): a multi-task
    encoder's token-level `LabelHead` (ERNIE 2.0's capitalization and token-document relation)."""

    config: ModelConfig
    num_labels: int

    @nn.compact
    def __call__(self, x_BLD, *, deterministic=True):
        cfg = self.config
        kw = dict(kernel_init=default_kernel_init(cfg.init_stddev), dtype=cfg.compute_dtype)
        x_BLD = nn.Dropout(cfg.dropout_rate)(x_BLD, deterministic=deterministic)
        return DenseGeneral((self.num_labels,), (P.EMBED,), (P.TABLE,), name="output", **kw)(x_BLD)


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator: dense D -> D, activation, dense D -> 1; logits_BL."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BLD):
        cfg = self.config
        kw = dict(kernel_init=default_kernel_init(cfg.init_stddev), dtype=cfg.compute_dtype)
        h = DenseGeneral((cfg.d_model,), (P.EMBED,), (P.MLP,), name="dense", **kw)(x_BLD)
        h = activation_fn(cfg.mlm_activation)(h)
        return DenseGeneral((1,), (P.EMBED,), (P.TABLE,), name="output", **kw)(h)[..., 0]
