"""A stack of blocks with its position machinery, cross-layer sharing and final norm."""

import flax.linen as nn

from lmsuite.layers.norm import make_norm
from lmsuite.layers.positions import RelativePositionBias
from lmsuite.models.block import Block, make_attention, make_mlp
from lmsuite.models.config import ModelConfig


class Stack(nn.Module):
    """x_BLD -> x_BLD through `num_layers` blocks.

    Layers are `layers_0` .. `layers_{n-1}`; with share_layers="all" a single `layers_shared`
    block runs n times (ALBERT); "attention"/"ffn" share `shared_attention` / `shared_mlp`
    between otherwise separate layers. T5 relative positions add `relative_bias`, computed once
    and used by every layer; DeBERTa adds `relative_embeddings`.
    """

    config: ModelConfig
    num_layers: int
    causal: bool = False
    has_cross: bool = False

    @nn.compact
    def __call__(
        self,
        x_BLD,
        *,
        mask=None,
        encoded_BMD=None,
        cross_mask=None,
        position_ids_BL=None,
        deterministic=True,
    ):
        cfg = self.config
        bias_BHLM = None
        attention_kwargs = None
        length = x_BLD.shape[1]
        if cfg.position_type == "t5_relative":
            bias_BHLM = RelativePositionBias(
                num_heads=cfg.num_heads,
                num_buckets=cfg.relative_buckets,
                max_distance=cfg.relative_max_distance,
                bidirectional=not self.causal,
                init_stddev=cfg.init_stddev,
                dtype=cfg.compute_dtype,
                name="relative_bias",
            )(length, length)
        elif cfg.position_type == "deberta":
            from lmsuite.layers.disentangled import RelativeEmbeddings

            attention_kwargs = RelativeEmbeddings(config=cfg, name="relative_embeddings")(
                length, position_ids_BL=position_ids_BL
            )

        kwargs = dict(
            mask=mask,
            bias_BHLM=bias_BHLM,
            encoded_BMD=encoded_BMD,
            cross_mask=cross_mask,
            deterministic=deterministic,
            attention_kwargs=attention_kwargs,
        )
        if cfg.share_layers == "all":
            block = Block(config=cfg, has_cross=self.has_cross, name="layers_shared")
            for _ in range(self.num_layers):
                x_BLD = block(x_BLD, **kwargs)
        else:
            shared_attention = shared_mlp = None
            if cfg.share_layers == "attention":
                shared_attention = make_attention(cfg, name="shared_attention")
            if cfg.share_layers == "ffn":
                shared_mlp = make_mlp(cfg, name="shared_mlp")
            for i in range(self.num_layers):
                x_BLD = Block(
                    config=cfg,
                    has_cross=self.has_cross,
                    attention=shared_attention,
                    mlp=shared_mlp,
                    name=f"layers_{i}",
                )(x_BLD, **kwargs)
        if cfg.final_norm:
            x_BLD = make_norm(
                cfg.norm_type,
                eps=cfg.norm_eps,
                use_bias=cfg.use_bias,
                dtype=cfg.compute_dtype,
                name="final_norm",
            )(x_BLD)
            x_BLD = nn.Dropout(cfg.dropout_rate)(x_BLD, deterministic=deterministic)
        return x_BLD
