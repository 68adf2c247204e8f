"""Input embeddings of one stack: tokens, segment types, absolute positions, norm, projection."""

import flax.linen as nn
import jax.numpy as jnp

from lmsuite import partitioning as P
from lmsuite.layers.dense import DenseGeneral, default_kernel_init
from lmsuite.layers.embedding import Embed
from lmsuite.layers.norm import make_norm
from lmsuite.layers.positions import sinusoidal_table
from lmsuite.models.config import ModelConfig


def make_token_embedder(config: ModelConfig) -> Embed:
    """The (V, E) token table, shared by encoder, decoder and tied output heads."""
    return Embed(
        num_embeddings=config.vocab_size,
        features=config.embed_width,
        row_name=P.VOCAB,
        col_name=P.EMBED,
        init_stddev=config.init_stddev,
        dtype=config.compute_dtype,
        name="token_embedder",
    )


class Embedder(nn.Module):
    """ids_BL -> x_BLD: token (+ type) (+ position) embeddings, optional norm, E -> D projection.

    Submodules: `type_embedder` (T, E), `position_embedder` (max_length, E), `embedding_norm`,
    `embedding_projection` (E -> D when E != D or config.project_embeddings, ALBERT/ELECTRA:
    applied after the norm; DeBERTa: before it, see config.embedding_projection_first).
    """

    config: ModelConfig
    token_embedder: nn.Module
    use_types: bool = True

    @nn.compact
    def __call__(
        self, ids_BL, *, type_ids_BL=None, position_ids_BL=None, mask_BL=None, deterministic=True
    ):
        """`mask_BL` (1 on real tokens) zeroes padded rows when config.mask_padded_embeddings."""
        cfg = self.config
        dtype = cfg.compute_dtype
        x_BLE = self.token_embedder(ids_BL)
        if cfg.scale_embeddings:
            x_BLE = x_BLE * jnp.asarray(cfg.d_model**0.5, dtype)
        if position_ids_BL is None:
            position_ids_BL = jnp.arange(ids_BL.shape[1])[None, :]
        if cfg.position_type in ("learned", "learned_relative") or (
            cfg.deberta is not None and cfg.deberta.position_biased_input
        ):
            table = Embed(
                num_embeddings=cfg.max_length,
                features=cfg.embed_width,
                row_name=P.TABLE,
                col_name=P.EMBED,
                init_stddev=cfg.init_stddev,
                dtype=dtype,
                name="position_embedder",
            )
            x_BLE = x_BLE + table(position_ids_BL + cfg.position_offset)
        elif cfg.position_type == "sinusoidal":
            table_PE = jnp.asarray(sinusoidal_table(cfg.max_length, cfg.embed_width), dtype)
            x_BLE = x_BLE + jnp.take(table_PE, position_ids_BL + cfg.position_offset, axis=0)
        if self.use_types and cfg.type_vocab_size > 0:
            if type_ids_BL is None:
                type_ids_BL = jnp.zeros_like(ids_BL)
            types = Embed(
                num_embeddings=cfg.type_vocab_size,
                features=cfg.embed_width,
                row_name=P.TABLE,
                col_name=P.EMBED,
                init_stddev=cfg.init_stddev,
                dtype=dtype,
                name="type_embedder",
            )
            x_BLE = x_BLE + types(type_ids_BL)
        project = cfg.embed_width != cfg.d_model or cfg.project_embeddings
        projection = lambda x: DenseGeneral(
            (cfg.d_model,),
            (P.EMBED,),
            (P.MLP,),
            use_bias=cfg.embedding_projection_bias,
            kernel_init=default_kernel_init(cfg.init_stddev),
            dtype=dtype,
            name="embedding_projection",
        )(x)
        if project and cfg.embedding_projection_first:
            x_BLE = projection(x_BLE)
        if cfg.embedding_norm:
            norm = make_norm(cfg.norm_type, eps=cfg.norm_eps, name="embedding_norm", dtype=dtype)
            x_BLE = norm(x_BLE)
        if cfg.mask_padded_embeddings and mask_BL is not None:
            x_BLE = x_BLE * mask_BL[:, :, None].astype(x_BLE.dtype)
        x_BLE = nn.Dropout(cfg.dropout_rate)(x_BLE, deterministic=deterministic)
        if project and not cfg.embedding_projection_first:
            x_BLE = projection(x_BLE)
        return nn.with_logical_constraint(x_BLE, (P.BATCH, P.LENGTH, P.EMBED))
