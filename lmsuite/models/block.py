"""One Transformer layer: self-attention, optional cross-attention, MLP; pre- or post-norm."""

import flax.linen as nn

from lmsuite import partitioning as P
from lmsuite.layers.attention import MultiHeadAttention
from lmsuite.layers.fused_attention import log_plain_once
from lmsuite.layers.mlp import MLP
from lmsuite.layers.norm import make_norm
from lmsuite.models.config import ModelConfig


def make_attention(config: ModelConfig, *, name: str, cross: bool = False) -> nn.Module:
    """The self- or cross-attention module a config asks for."""
    if config.position_type == "deberta" and not cross:
        from lmsuite.layers.disentangled import DisentangledAttention

        if config.attention_impl == "fused":
            log_plain_once("DeBERTa's disentangled attention has no fused kernel")
        return DisentangledAttention(config=config, name=name)
    return MultiHeadAttention(
        num_heads=config.num_heads,
        head_dim=config.head_width,
        use_bias=config.use_bias,
        use_key_bias=config.use_key_bias,
        scale_logits=config.scale_attention,
        # TUPE divides by sqrt(2K): content and positional terms weigh alike (attn_scale_factor).
        scale_factor=2.0 if config.position_type == "tupe" and not cross else 1.0,
        dropout_rate=config.attention_dropout_rate,
        init_stddev=config.init_stddev,
        dtype=config.compute_dtype,
        float32_scores=config.float32_scores,
        attention_impl=config.attention_impl,
        name=name,
    )


def make_mlp(config: ModelConfig, *, name: str) -> MLP:
    return MLP(
        d_ff=config.d_ff,
        activation=config.activation,
        use_bias=config.use_bias,
        dropout_rate=config.dropout_rate if config.mlp_inner_dropout else 0.0,
        init_stddev=config.init_stddev,
        dtype=config.compute_dtype,
        name=name,
    )


class Block(nn.Module):
    """x_BLD -> x_BLD. Pass `attention` / `mlp` instances to share them across layers.

    Submodules: `attention`, `cross_attention`, `mlp`, and norms named by their place:
    `pre_attention_norm`, `pre_cross_attention_norm`, `pre_mlp_norm` (pre-norm) or
    `post_attention_norm`, `post_cross_attention_norm`, `post_mlp_norm` (post-norm).

    `kv_BLD` (post-norm only) gives self-attention separate keys/values, x_BLD being the query
    states: DeBERTa's enhanced mask decoder (`enhanced_mask_decoder.py`).

    With a `cache` ({"attention": kv, "cross_attention": kv}, see `MultiHeadAttention`; the
    cross entry is absent until the encoder output has been projected once) the call returns
    (x_BLD, new cache) and `encoded_BMD` may be None once the cross entry is there.

    `mask_layout` / `cross_mask_layout` describe `mask` / `cross_mask` for fused attention
    (`masks.MaskLayout`); they reach `MultiHeadAttention` only.
    """

    config: ModelConfig
    has_cross: bool = False
    attention: nn.Module | None = None
    mlp: nn.Module | None = None

    @nn.compact
    def __call__(
        self,
        x_BLD,
        *,
        mask=None,
        bias_BHLM=None,
        encoded_BMD=None,
        cross_mask=None,
        deterministic=True,
        attention_kwargs=None,
        cache=None,
        cache_index=None,
        kv_BLD=None,
        mask_layout=None,
        cross_mask_layout=None,
    ):
        cfg = self.config
        pre = cfg.norm_position == "pre"
        if kv_BLD is not None and (pre or cache is not None):
            raise ValueError("separate keys/values (kv_BLD) need a post-norm block without a cache")
        where = "pre" if pre else "post"
        norm = lambda what: make_norm(
            cfg.norm_type,
            eps=cfg.norm_eps,
            use_bias=cfg.use_bias,
            dtype=cfg.compute_dtype,
            name=f"{where}_{what}_norm",
        )
        drop = lambda h: nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)

        def sublayer(x, what, fn):
            if pre:
                return x + drop(fn(norm(what)(x)))
            return norm(what)(x + drop(fn(x)))

        new_cache = {}

        def cached(what, call):
            # Attention without a cache returns its output; with one, (output, new entry).
            if cache is None:
                return call

            def unpack(h):
                out, new_cache[what] = call(h)
                return out

            return unpack

        attention = self.attention or make_attention(cfg, name="attention")
        # DeBERTa's attention takes no layout: it always runs its own plain path.
        with_layout = lambda module, layout: (
            {}
            if layout is None or not isinstance(module, MultiHeadAttention)
            else dict(mask_layout=layout)
        )
        self_cache = (
            None if cache is None else dict(cache=cache["attention"], cache_index=cache_index)
        )
        x_BLD = sublayer(
            x_BLD,
            "attention",
            cached(
                "attention",
                lambda h: attention(
                    h,
                    h if kv_BLD is None else kv_BLD,
                    mask=mask,
                    bias_BHLM=bias_BHLM,
                    deterministic=deterministic,
                    **(attention_kwargs or {}),
                    **(self_cache or {}),
                    **with_layout(attention, mask_layout),
                ),
            ),
        )
        if self.has_cross:
            cross = make_attention(cfg, name="cross_attention", cross=True)
            memory = None
            if cache is not None:
                memory = dict(cache=cache.get("cross_attention"))
                if memory["cache"] is None:
                    if encoded_BMD is None:
                        raise ValueError("a first cached decoding step needs encoded_BMD")
                    memory["cache"] = {}
                else:
                    encoded_BMD = None  # already projected: the cache holds its keys/values
            x_BLD = sublayer(
                x_BLD,
                "cross_attention",
                cached(
                    "cross_attention",
                    lambda h: cross(
                        h,
                        encoded_BMD,
                        mask=cross_mask,
                        deterministic=deterministic,
                        **(memory or {}),
                        **with_layout(cross, cross_mask_layout),
                    ),
                ),
            )
        mlp = self.mlp or make_mlp(cfg, name="mlp")
        x_BLD = sublayer(x_BLD, "mlp", lambda h: mlp(h, deterministic=deterministic))
        x_BLD = nn.with_logical_constraint(x_BLD, (P.BATCH, P.LENGTH, P.EMBED))
        return x_BLD if cache is None else (x_BLD, new_cache)
