"""XLNet (Yang et al. 2019): two-stream attention over Transformer-XL's relative positions and
memory.

The content stream h is an ordinary bidirectional (or, with attn_type="uni", causal) stream over
the tokens. The query stream g starts from one learned vector, `mask_emb`, at each of the P
predicted positions named by `target_mapping`, and attends to the content stream without ever
seeing its own token: that is what lets a permutation LM predict a token from its position alone.
Both streams share every projection, norm and FFN of a layer; keys and values always come from
the content stream, prefixed by the memory of the previous segment (the memory and the relative
distances, which Transformer-XL's LM uses alone, are `segment_recurrence`'s).

`perm_mask[b, i, j] = 1` blocks query i from key j (both streams, except that the content stream
always sees itself). A query whose every key is blocked attends to all keys uniformly, as in
the reference implementation and HF (scores are shifted by -1e30, not removed); XLNet's data
keeps every row open (non-target tokens and memory are visible to all).

Parameters (flat paths): `token_embedder`, `mask_emb`, `layers_{i}/attention/{query,key,value,
position,out}` and its biases, `layers_{i}/{post_attention_norm,mlp,post_mlp_norm}`,
`relative_biases` when untie_r=False, and `lm_head`. `Transformer(config)` is this module for
architecture="xlnet" (`families.XLNET`), so these paths sit at the top of the tree.
"""

import functools
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lmsuite import partitioning as P
from lmsuite.layers.attention import attention_scores
from lmsuite.layers.dense import DenseGeneral, default_kernel_init
from lmsuite.layers.masks import causal_memory_mask
from lmsuite.layers.mlp import MLP
from lmsuite.layers.norm import make_norm
from lmsuite.models.config import ModelConfig
from lmsuite.models.embedder import make_token_embedder
from lmsuite.models.heads import VocabHead
from lmsuite.models.segment_recurrence import (
    cache_memory,
    relative_positions,
    relative_shift,
    relative_shift_rows,
)
from lmsuite.models.stack import rematted

# Score shift of a blocked key. Float32 scores are O(10), far below the spacing of floats near
# 1e30, so a fully blocked row becomes uniform exactly as in the reference.
_BLOCKED = 1e30


def _rows(x_B1LM, rows_BQ):
    """x's rows at the positions rows_BQ: (B or 1, 1, L, M) -> (B, 1, Q, M)."""
    x_B1LM = jnp.broadcast_to(x_B1LM, (rows_BQ.shape[0], *x_B1LM.shape[1:]))
    return jnp.take_along_axis(x_B1LM, rows_BQ[:, None, :, None], axis=2)


# --------------------------------------------------------------------------- validation
def _concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def validate_inputs(
    config: ModelConfig,
    input_ids,
    *,
    attention_mask=None,
    token_type_ids=None,
    perm_mask=None,
    target_mapping=None,
    mems=None,
):
    """Raises ValueError for inputs XLNet cannot take; id ranges are checked when concrete."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
    batch, length = input_ids.shape
    for name, ids in (("input_ids", input_ids), ("token_type_ids", token_type_ids)):
        if ids is None:
            continue
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ValueError(f"{name} must hold integers, got dtype {ids.dtype}")
        if tuple(ids.shape) != (batch, length):
            raise ValueError(f"{name} must be (B, L) = {(batch, length)}, got {tuple(ids.shape)}")
        if _concrete(ids) and ids.size:
            values = np.asarray(ids)
            hi = config.vocab_size if name == "input_ids" else None
            if values.min() < 0 or (hi is not None and values.max() >= hi):
                bad = values.min() if values.min() < 0 else values.max()
                raise ValueError(f"{name} holds id {int(bad)}, outside [0, {hi or 'inf'})")
    shapes = (
        ("attention_mask", attention_mask, (batch, length)),
        ("perm_mask", perm_mask, (batch, length, length)),
    )
    for name, x, expected in shapes:
        if x is not None and tuple(x.shape) != expected:
            raise ValueError(f"{name} must be {expected}, got {tuple(x.shape)}")
    if target_mapping is not None:
        tm = tuple(target_mapping.shape)
        if len(tm) != 3 or tm[0] != batch or tm[2] != length or tm[1] < 1:
            raise ValueError(
                f"target_mapping must be (B, P, L) = ({batch}, P >= 1, {length}), got {tm}"
            )
    if mems is not None:
        if len(mems) != config.num_layers:
            raise ValueError(
                f"mems must hold one array per layer ({config.num_layers}), got {len(mems)}"
            )
        first = tuple(mems[0].shape)
        if len(first) != 3 or first[0] != batch or first[2] != config.d_model:
            raise ValueError(
                f"mems[0] must be (B, C, D) = ({batch}, C, {config.d_model}), got {first}"
            )
        for i, m in enumerate(mems):
            if tuple(m.shape) != first:
                raise ValueError(
                    f"mems[{i}] has shape {tuple(m.shape)}, but mems[0] has {first}; every "
                    "layer keeps the same memory length"
                )
    if config.xlnet.bi_data and batch % 2:
        raise ValueError(
            f"XLNetOptions.bi_data needs an even batch (forward and backward halves), got {batch}"
        )


# ------------------------------------------------------------------------- attention
def relative_bias_params(
    module: nn.Module, config: ModelConfig, *, segments: bool = True
) -> dict[str, jax.Array]:
    """The query biases of relative attention, created in `module`: `content_bias` (u, HF's
    r_w_bias), `position_bias` (v, r_r_bias) and, with `segments`, `segment_bias` (r_s_bias),
    each (H, K)."""
    init = nn.with_logical_partitioning(default_kernel_init(config.init_stddev), (P.HEADS, P.KV))
    shape = (config.num_heads, config.head_width)
    names = ("content_bias", "position_bias") + (("segment_bias",) if segments else ())
    return {name: module.param(name, init, shape) for name in names}


class RelativeBiases(nn.Module):
    """One set of relative-attention biases shared by every layer (untie_r=False)."""

    config: ModelConfig
    segments: bool = True

    @nn.compact
    def __call__(self) -> dict[str, jax.Array]:
        return relative_bias_params(self, self.config, segments=self.segments)


class TwoStreamAttention(nn.Module):
    """Relative multi-head attention of both streams over the content keys and values.

    Submodules `query`, `key`, `value`, `position` (D -> H, K) and `out` (H, K -> D), none with
    a bias; parameter `segment_embedding` (2, H, K): "same segment", "different segment"
    (only with `segments`: Transformer-XL has no segment term).
    """

    config: ModelConfig
    segments: bool = True

    @nn.compact
    def __call__(
        self,
        h_BLD,
        g_BPD,
        *,
        shared_biases,
        mem_BCD,
        positions,
        other_segment_B1LM,
        content_allowed,
        query_allowed,
        target_BPL,
        deterministic,
    ):
        """Returns the attention outputs (before residual and norm) of h and of g (or None).

        `shared_biases` are the stack's RelativeBiases (untie_r=False), or None for this
        layer's own. `positions` is a tuple of (R, D) encodings: one, or two under bi_data
        (forward for the first half of the batch, backward for the second).
        """
        cfg = self.config
        dtype = cfg.compute_dtype
        kinit = default_kernel_init(cfg.init_stddev)
        proj = lambda name: DenseGeneral(
            (cfg.num_heads, cfg.head_width),
            (P.EMBED,),
            (P.HEADS, P.KV),
            use_bias=False,
            kernel_init=kinit,
            dtype=dtype,
            name=name,
        )
        biases = shared_biases
        if biases is None:
            biases = relative_bias_params(self, cfg, segments=self.segments)
        if self.segments:
            segment_THK = self.param(
                "segment_embedding",
                nn.with_logical_partitioning(kinit, (P.TABLE, P.HEADS, P.KV)),
                (2, cfg.num_heads, cfg.head_width),
            )
        elif other_segment_B1LM is not None:
            raise ValueError("this attention has no segment term: token_type_ids must be None")
        as_11HK = lambda name: jnp.asarray(biases[name], dtype)[None, None]
        query = proj("query")
        kv_BMD = h_BLD if mem_BCD is None else jnp.concatenate([mem_BCD, h_BLD], axis=1)
        k_BMHK = proj("key")(kv_BMD)
        v_BMHK = proj("value")(kv_BMD)
        position = proj("position")
        kr = [position(jnp.asarray(r_RD, dtype)) for r_RD in positions]
        num_keys = kv_BMD.shape[1]
        scale = jnp.asarray(cfg.head_width**-0.5, jnp.float32)
        drop = nn.Dropout(cfg.attention_dropout_rate)

        length = h_BLD.shape[1]
        scores = functools.partial(attention_scores, float32=cfg.float32_scores)

        def attend(q_BQHK, allowed, rows_BQ=None):
            """Q queries: the L positions in order (rows_BQ None), or queries at the positions
            rows_BQ, which read those positions' distances, segments and mask rows."""
            at_rows = lambda x_B1LM: x_B1LM if rows_BQ is None else _rows(x_B1LM, rows_BQ)
            ac_BHQM = scores("BQHK,BMHK->BHQM", q_BQHK + as_11HK("content_bias"), k_BMHK)
            qr_BQHK = q_BQHK + as_11HK("position_bias")
            halves = zip(jnp.split(qr_BQHK, len(kr), axis=0), kr, strict=True)
            bd_BHQR = jnp.concatenate(
                [scores("BQHK,RHK->BHQR", q, kr_RHK) for q, kr_RHK in halves], axis=0
            )
            if rows_BQ is None:
                bd_BHQM = relative_shift(bd_BHQR, num_keys)
            else:
                bd_BHQM = relative_shift_rows(bd_BHQR, rows_BQ, length, num_keys)
            logits_BHQM = ac_BHQM + bd_BHQM
            if other_segment_B1LM is not None:
                qs_BQHK = q_BQHK + as_11HK("segment_bias")
                ef_BHQT = scores("BQHK,THK->BHQT", qs_BQHK, jnp.asarray(segment_THK, dtype))
                logits_BHQM = logits_BHQM + jnp.where(
                    at_rows(other_segment_B1LM), ef_BHQT[..., 1:], ef_BHQT[..., :1]
                )
            logits_BHQM = logits_BHQM.astype(jnp.float32) * scale
            if allowed is not None:
                logits_BHQM = logits_BHQM - jnp.where(at_rows(allowed), 0.0, _BLOCKED)
            probs_BHQM = jax.nn.softmax(logits_BHQM, axis=-1).astype(dtype)
            probs_BHQM = drop(probs_BHQM, deterministic=deterministic)
            return jnp.einsum("BHQM,BMHK->BQHK", probs_BHQM, v_BMHK)

        out = DenseGeneral(
            (cfg.d_model,),
            (P.HEADS, P.KV),
            (P.EMBED,),
            use_bias=False,
            kernel_init=kinit,
            dtype=dtype,
            name="out",
        )
        out_h = out(attend(query(h_BLD), content_allowed))
        if g_BPD is None:
            return out_h, None
        # Each prediction is scored at its position, reading that position's relative distances
        # and mask row. The reference places the P queries at all L positions (a one-hot
        # product), scores every position and gathers the P rows back: the same numbers at
        # L/P times the work. A zero row of target_mapping (a padded prediction) gets a zero
        # attention output there, and here too.
        rows_BP = jnp.argmax(target_BPL, axis=-1)
        named_BP11 = (jnp.max(target_BPL, axis=-1) > 0)[:, :, None, None]
        vec_BPHK = attend(query(g_BPD), query_allowed, rows_BP)
        return out_h, out(jnp.where(named_BP11, vec_BPHK, 0).astype(vec_BPHK.dtype))


class TwoStreamLayer(nn.Module):
    """One post-norm XLNet layer applied to both streams with the same parameters.

    Submodules `attention`, `post_attention_norm`, `mlp` (`wi`, `wo`), `post_mlp_norm`.
    """

    config: ModelConfig
    segments: bool = True

    @nn.compact
    def __call__(self, h_BLD, g_BPD, deterministic, **attention_inputs):
        """`deterministic` is positional: nn.remat (ModelConfig.remat) takes it as static."""
        cfg = self.config
        dtype = cfg.compute_dtype
        norm = lambda name: make_norm(cfg.norm_type, eps=cfg.norm_eps, dtype=dtype, name=name)
        attention_norm, mlp_norm = norm("post_attention_norm"), norm("post_mlp_norm")
        mlp = MLP(
            d_ff=cfg.d_ff,
            activation=cfg.activation,
            dropout_rate=cfg.dropout_rate,  # XLNet drops between the two FFN matmuls too
            init_stddev=cfg.init_stddev,
            dtype=dtype,
            name="mlp",
        )
        drop = lambda x: nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        attended_h, attended_g = TwoStreamAttention(
            config=cfg, segments=self.segments, name="attention"
        )(h_BLD, g_BPD, deterministic=deterministic, **attention_inputs)

        def finish(x, attended):
            x = attention_norm(x + drop(attended))
            return mlp_norm(x + drop(mlp(x, deterministic=deterministic)))

        h_BLD = nn.with_logical_constraint(finish(h_BLD, attended_h), (P.BATCH, P.LENGTH, P.EMBED))
        if g_BPD is not None:
            g_BPD = nn.with_logical_constraint(
                finish(g_BPD, attended_g), (P.BATCH, P.LENGTH, P.EMBED)
            )
        return h_BLD, g_BPD


# --------------------------------------------------------------------------- the stack
def attention_masks(config: ModelConfig, length: int, memory: int, *, attention_mask, perm_mask):
    """(content, query) "may attend" masks over the C + L keys, (B or 1, 1, L, M), or (None,
    None) when nothing is blocked. Memory keys are never blocked by padding or perm_mask; the
    content stream always sees its own position.

    E.g. attn_type="bi", no memory, perm_mask [[1, 1], [0, 1]] (position 0 is predicted first:
    it sees nothing; position 1 then sees it): query mask [[0, 0], [1, 0]], content mask
    [[1, 0], [1, 1]].
    """
    opts = config.xlnet
    blocked = []
    if opts.attn_type == "uni":
        blocked.append(~causal_memory_mask(length, memory, same_length=opts.same_length))
    if attention_mask is not None:
        pad_BL = ~attention_mask.astype(bool)
        pad_BM = jnp.pad(pad_BL, ((0, 0), (memory, 0)))
        blocked.append(pad_BM[:, None, None, :])
    if perm_mask is not None:
        perm_BLM = jnp.pad(perm_mask > 0, ((0, 0), (0, 0), (memory, 0)))
        blocked.append(perm_BLM[:, None])
    if not blocked:
        return None, None
    query_blocked = blocked[0]
    for b in blocked[1:]:
        query_blocked = query_blocked | b
    itself_11LM = jnp.arange(memory + length)[None, :] == memory + jnp.arange(length)[:, None]
    content_blocked = query_blocked & ~itself_11LM[None, None]
    return ~content_blocked, ~query_blocked


class TwoStreamTransformer(nn.Module):
    """ids -> {"hidden", "lm_logits", "new_mems"}: XLNet and its LM head (tied unless
    config.tie_embeddings=False, with its own bias `lm_head/output_bias`).

    hidden / lm_logits are the query stream's (B, P, D) / (B, P, V) at the predicted positions
    when `target_mapping` is given, else the content stream's (B, L, D) / (B, L, V). new_mems
    holds one (B, C', D) array per layer, to be passed as `mems` with the next segment.

    `query_stream=False` (`TransformerXL`) builds the content stream alone: no `mask_emb`, no
    segment embedding or bias; `perm_mask`, `target_mapping` and `token_type_ids` are refused.
    """

    config: ModelConfig
    query_stream: bool = True

    @nn.compact
    def __call__(
        self,
        input_ids,
        *,
        attention_mask=None,
        token_type_ids=None,
        perm_mask=None,
        target_mapping=None,
        mems: Sequence[jax.Array] | None = None,
        deterministic: bool = True,
    ) -> dict:
        """Runs both streams.

        Args:
          input_ids: (B, L) token ids.
          attention_mask: (B, L) 1 for real tokens, 0 for padding (padded keys are blocked).
          token_type_ids: (B, L) segment ids (XLNet: 0, 1, and 2 for <cls>); attention adds a
            learned "same / different segment" term. Memory counts as segment 0.
          perm_mask: (B, L, L), 1 where query i may not attend to key j.
          target_mapping: (B, P, L), one-hot rows naming the P predicted positions.
          mems: one (B, C, D) array per layer, the `new_mems` of the previous segment.
          deterministic: False enables dropout (needs a "dropout" rng).
        """
        cfg = self.config
        if mems is not None and len(mems) == 0:
            mems = None
        if not self.query_stream:
            given = {"perm_mask": perm_mask, "target_mapping": target_mapping}
            given["token_type_ids"] = token_type_ids
            extra = sorted(k for k, v in given.items() if v is not None)
            if extra:
                raise ValueError(
                    f"{type(self).__name__} is one causal stream without segments: it takes "
                    f"input_ids, attention_mask and mems, got {extra} too"
                )
        validate_inputs(
            cfg,
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            mems=mems,
        )
        dtype = cfg.compute_dtype
        batch, length = input_ids.shape
        memory = 0 if mems is None else mems[0].shape[1]
        drop = lambda x: nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)

        token_embedder = make_token_embedder(cfg)
        # Created whether or not this call has a query stream, so that every call sees one tree.
        if self.query_stream:
            mask_emb_D = self.param(
                "mask_emb",
                nn.with_logical_partitioning(default_kernel_init(cfg.init_stddev), (P.EMBED,)),
                (cfg.d_model,),
            )
        shared_biases = None
        if not cfg.xlnet.untie_r:
            shared_biases = RelativeBiases(cfg, self.query_stream, name="relative_biases")()

        x_BLD = token_embedder(input_ids)
        if cfg.scale_embeddings:  # Transformer-XL's AdaptiveEmbedding scales by sqrt(d_model)
            x_BLD = x_BLD * jnp.asarray(cfg.d_model**0.5, dtype)
        h_BLD = drop(x_BLD)
        g_BPD = None
        if target_mapping is not None:
            shape = (batch, target_mapping.shape[1], cfg.d_model)
            g_BPD = drop(jnp.broadcast_to(jnp.asarray(mask_emb_D, dtype)[None, None], shape))
        content_allowed, query_allowed = attention_masks(
            cfg, length, memory, attention_mask=attention_mask, perm_mask=perm_mask
        )
        other_segment_B1LM = None
        if token_type_ids is not None:
            keys_BM = jnp.pad(token_type_ids, ((0, 0), (memory, 0)))
            other_segment_B1LM = (token_type_ids[:, :, None] != keys_BM[:, None, :])[:, None]
        positions = tuple(drop(r) for r in relative_positions(cfg, length, memory + length))

        new_mems = []
        layer = rematted(self.config, TwoStreamLayer, static_argnums=(3,))
        for i in range(cfg.num_layers):
            mem_BCD = None if mems is None else jnp.asarray(mems[i], dtype)
            new_mems.append(cache_memory(cfg, h_BLD, mem_BCD))
            h_BLD, g_BPD = layer(config=cfg, segments=self.query_stream, name=f"layers_{i}")(
                h_BLD,
                g_BPD,
                deterministic,
                shared_biases=shared_biases,
                mem_BCD=mem_BCD,
                positions=positions,
                other_segment_B1LM=other_segment_B1LM,
                content_allowed=content_allowed,
                query_allowed=query_allowed,
                target_BPL=target_mapping,
            )
        hidden = h_BLD if g_BPD is None else g_BPD
        head = VocabHead(config=cfg, token_embedder=token_embedder, transform=False, name="lm_head")
        return {"hidden": hidden, "lm_logits": head(drop(hidden)), "new_mems": tuple(new_mems)}


class TransformerXL(TwoStreamTransformer):
    """Transformer-XL's LM (Dai et al. 2019; kimiyoung/transformer-xl `pytorch/mem_transformer.py`
    `MemTransformerLM` with attn_type 0): the content stream alone, causal over memory and
    segment (XLNetOptions.attn_type="uni"), relative positions with the biases u
    (`content_bias`) and v (`position_bias`), shared by all layers when untie_r=False as in the
    reference, and the memory of `cache_memory`. ids -> {"hidden", "lm_logits" (B, L, V),
    "new_mems"}; `Transformer(config)` for architecture="transformer_xl".
    """

    query_stream: bool = False
