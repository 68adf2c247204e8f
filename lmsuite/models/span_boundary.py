"""SpanBERT's span boundary objective (SBO) head: each masked token predicted from the two
tokens just outside its masked span and its offset inside it.

Joshi et al. 2020, section 3.2, as facebookresearch/SpanBERT builds it
(`pretraining/fairseq/models/pair_bert.py`: `BertPairTargetPredictionHead`, `MLPWithLayerNorm`).
For a masked token x_i of the masked run [s, e], with encoder outputs x:

    h0 = [x_{s-1}; x_{e+1}; p_{i-s}]        p: a learned table of in-span offsets (0-based)
    h1 = LayerNorm(GeLU(W1 h0 + b1))
    y  = LayerNorm(GeLU(W2 h1 + b2))
    logits = y T^T + b                       T: the token table (tied), b: the head's own bias

The reference sizes the offset table with `--max-pair-targets` rows (15 in its published
command) of width 200 (`position_embedding_size`, a constant there), so
`ModelConfig.sbo_max_span` and `ModelConfig.sbo_position_dim` default to those. The head reads
the last layer's outputs (`pair_target_layer=-1` in the reference).

W1 acts on the concatenation; here it is held as two kernels, one over the stacked boundaries
(C, D) -> D and one over the offset embedding W -> D, which is the same map written blockwise:
the 2D + W input width of a single kernel would not split evenly over an fsdp mesh axis that
splits D. W2 maps D -> E, the token table's width (E = D in BERT and SpanBERT), so the tied
projection also works for factorised embeddings.

Dimension letters: B batch, L length, P predictions, C the two boundaries (left, right),
D model, E embedding, V vocabulary, S offset-table rows, W offset-embedding width.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lmsuite import partitioning as P
from lmsuite.layers.dense import DenseGeneral, default_kernel_init
from lmsuite.layers.mlp import activation_fn
from lmsuite.layers.norm import make_norm
from lmsuite.models.config import ModelConfig
from lmsuite.models.heads import VocabHead, gather_positions

# The model's keyword arguments, named as the data's features (`preprocessors.spanbert.SBO_KEYS`).
INPUTS = ("span_left_positions", "span_right_positions", "span_offsets")


class SpanBoundaryHead(nn.Module):
    """(hidden_BLD, left_BP, right_BP, offsets_BP) -> sbo logits_BPV (see the module docstring).

    Offsets beyond the table (>= config.sbo_max_span) read its last row; the reference gives
    such tokens no SBO target, and so does `lmsuite.objectives.spanbert` (weight 0).
    """

    config: ModelConfig
    token_embedder: nn.Module

    @nn.compact
    def __call__(self, hidden_BLD, left_BP, right_BP, offsets_BP):
        cfg = self.config
        dtype = cfg.compute_dtype
        kinit = default_kernel_init(cfg.init_stddev)
        x_BPCD = jnp.stack(
            [gather_positions(hidden_BLD, left_BP), gather_positions(hidden_BLD, right_BP)],
            axis=2,
        )
        table_SW = self.param(
            "offset_embedding",
            nn.with_logical_partitioning(kinit, (P.TABLE, P.TABLE)),
            (cfg.sbo_max_span, cfg.sbo_position_dim),
        )
        rows_BP = jnp.clip(offsets_BP.astype(jnp.int32), 0, cfg.sbo_max_span - 1)
        p_BPW = jnp.take(table_SW, rows_BP, axis=0).astype(dtype)  # float32 scatter (Embed)

        dense = lambda width, in_names, name, **kw: DenseGeneral(
            (width,), in_names, (P.MLP,), kernel_init=kinit, dtype=dtype, name=name, **kw
        )
        act = activation_fn(cfg.mlm_activation)
        norm = lambda name: make_norm(cfg.norm_type, eps=cfg.norm_eps, dtype=dtype, name=name)
        h_BPD = dense(cfg.d_model, (P.TABLE, P.EMBED), "boundaries")(x_BPCD)
        h_BPD = h_BPD + dense(cfg.d_model, (P.TABLE,), "offsets", use_bias=False)(p_BPW)
        h_BPD = norm("norm_0")(act(h_BPD))
        y_BPE = norm("norm_1")(act(dense(cfg.embed_width, (P.EMBED,), "dense_1")(h_BPD)))
        # Constrained as the MLM head's transform output, for the same partitioner reason.
        y_BPE = nn.with_logical_constraint(y_BPE, (P.BATCH, P.LENGTH, P.EMBED))
        return VocabHead(
            config=cfg, token_embedder=self.token_embedder, transform=False, name="output"
        )(y_BPE)


def span_inputs(config: ModelConfig, given: dict, masked_positions) -> tuple | None:
    """The (left, right, offsets) the model was given, or None; ValueError for a partial set,
    span inputs to a model without the "sbo" head, or shapes that differ from each other or
    from masked_positions (the span features are aligned with it)."""
    present = [name for name in INPUTS if given.get(name) is not None]
    if not present:
        return None
    if "sbo" not in config.heads:
        raise ValueError(f"{present} given, but ModelConfig.heads = {config.heads} has no 'sbo'")
    if len(present) != len(INPUTS):
        missing = [name for name in INPUTS if name not in present]
        raise ValueError(f"the sbo head needs all of {list(INPUTS)}; {missing} are missing")
    values = tuple(given[name] for name in INPUTS)
    reference = ("masked_positions", masked_positions) if masked_positions is not None else None
    reference = reference or (INPUTS[0], values[0])
    for name, x in zip(INPUTS, values, strict=True):
        if x.ndim != 2 or tuple(x.shape) != tuple(reference[1].shape):
            raise ValueError(
                f"{name} must be (batch, P) with the shape of {reference[0]} "
                f"{tuple(reference[1].shape)}, got {tuple(x.shape)}"
            )
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name} must hold integers, got dtype {x.dtype}")
    return values


def outputs(config, token_embedder, hidden_BLD, spans, *, initializing: bool) -> dict:
    """{"sbo_logits": (B, P, V)} for the given spans; {} without them. At init the head is
    built on zero predictions anyway, so every parameter tree of an "sbo" model has its
    parameters, whatever inputs built it (conversion, summaries, checkpoint loading)."""
    head = SpanBoundaryHead(config=config, token_embedder=token_embedder, name="sbo_head")
    if spans is None:
        if initializing:
            none_B0 = jnp.zeros((hidden_BLD.shape[0], 0), jnp.int32)
            head(hidden_BLD, none_B0, none_B0, none_B0)
        return {}
    length = hidden_BLD.shape[1]
    for name, x in zip(INPUTS[:2], spans[:2], strict=True):
        if not isinstance(x, jax.core.Tracer) and x.size:
            lo, hi = int(np.min(x)), int(np.max(x))
            if lo < 0 or hi >= length:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{name} holds position {bad}, outside [0, {length})")
    return {"sbo_logits": head(hidden_BLD, *spans)}
