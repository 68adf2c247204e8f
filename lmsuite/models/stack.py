"""A stack of blocks with its position machinery, cross-layer sharing and final norm."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lmsuite import partitioning as P
from lmsuite.layers import masks
from lmsuite.layers.attention import init_kv_cache
from lmsuite.layers.norm import make_norm
from lmsuite.layers.positions import RelativePositionBias
from lmsuite.layers.untied_positions import UntiedPositionBias
from lmsuite.models.block import Block, make_attention, make_mlp
from lmsuite.models.config import ModelConfig
from lmsuite.models.enhanced_mask_decoder import EnhancedMaskDecoder


class Stack(nn.Module):
    """x_BLD -> x_BLD through `num_layers` blocks.

    Layers are `layers_0` .. `layers_{n-1}`; with share_layers="all" a single `layers_shared`
    block runs n times (ALBERT); "attention"/"ffn" share `shared_attention` / `shared_mlp`
    between otherwise separate layers. T5 relative positions add `relative_bias`, computed once
    and used by every layer; TUPE's positional term (`untied_positions`) likewise; DeBERTa adds
    `relative_embeddings`.

    ModelConfig.remat runs each block under nn.remat; ModelConfig.scan_layers runs one block
    `layers` under nn.scan, its parameters stacked on a leading axis (`scan_layout` converts
    between the two layouts).

    With config.emd_layers the call returns (x_BLD, mlm_BLD): the MLM head's input from
    `enhanced_mask_decoder` (the second-to-last layer's output through the last block again).

    Cached decoding (causal stacks only): `cache` maps `layers_{i}` (one entry per application,
    also when a block is shared) to that block's cache, the L inputs sit at positions
    [cache_index, cache_index + L) of the M cached ones, and the call returns (x_BLD, new cache).

    `mask_layout` / `cross_mask_layout` (`masks.MaskLayout`) let attention_impl "fused" read the
    masks' structure; the dense masks stay for the plain path.
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
        cache=None,
        cache_index=None,
        mask_layout=None,
        cross_mask_layout=None,
    ):
        cfg = self.config
        bias_BHLM = None
        attention_kwargs = None
        length = x_BLD.shape[1]
        if cache is not None and (not self.causal or cfg.position_type == "deberta"):
            raise ValueError("a key/value cache is for causal stacks (decoders) only")
        if cfg.position_type == "t5_relative":
            relative_bias = RelativePositionBias(
                num_heads=cfg.num_heads,
                num_buckets=cfg.relative_buckets,
                max_distance=cfg.relative_max_distance,
                bidirectional=not self.causal,
                init_stddev=cfg.init_stddev,
                dtype=cfg.compute_dtype,
                name="relative_bias",
            )
            if cache is None:
                bias_BHLM = relative_bias(length, length)
            else:
                bias_BHLM = _cached_relative_bias(relative_bias, cache, length, cache_index)
        elif cfg.position_type == "learned_relative":
            # UniLMv2's bias: over the position ids' distances, so that a pseudo token sits
            # where its target does; the learned table is added to the embeddings.
            bias_BHLM = RelativePositionBias(
                num_heads=cfg.num_heads,
                num_buckets=cfg.relative_buckets,
                max_distance=cfg.relative_max_distance,
                bidirectional=True,
                max_positions=cfg.max_positions,
                init_stddev=cfg.init_stddev,
                dtype=cfg.compute_dtype,
                name="relative_bias",
            )(length, length, position_ids_BL=position_ids_BL)
        elif cfg.position_type == "tupe":
            bias_BHLM = UntiedPositionBias(
                num_heads=cfg.num_heads,
                head_dim=cfg.head_width,
                features=cfg.d_model,
                max_length=cfg.max_length,
                num_buckets=cfg.tupe.relative_buckets if cfg.tupe.relative_bias else 0,
                max_distance=cfg.tupe.relative_max_distance,
                norm_type=cfg.norm_type,
                norm_eps=cfg.norm_eps,
                init_stddev=cfg.init_stddev,
                dtype=cfg.compute_dtype,
                float32_scores=cfg.float32_scores,
                name="untied_positions",
            )(length, position_ids_BL=position_ids_BL)
        elif cfg.position_type == "deberta":
            from lmsuite.layers.disentangled import RelativeEmbeddings

            attention_kwargs = RelativeEmbeddings(config=cfg, name="relative_embeddings")(
                length, position_ids_BL=position_ids_BL
            )

        if cache is not None and cfg.scan_layers:
            raise ValueError(
                "cached decoding runs the unscanned layout: convert the parameters with "
                "scan_layout.unscan_params and use config.replace(scan_layers=False)"
            )
        inputs = (
            mask, bias_BHLM, encoded_BMD, cross_mask, attention_kwargs, mask_layout,
            cross_mask_layout,
        )  # fmt: skip
        layer = dict(config=cfg, has_cross=self.has_cross, deterministic=deterministic)
        if cfg.scan_layers:
            x_BLD, _ = _scanned(cfg, self.num_layers)(**layer, name="layers")(x_BLD, *inputs)
            penultimate_BLD = None  # the enhanced mask decoder, which reads it, is not scanned
            blocks = []
        elif cfg.share_layers == "all":
            block = rematted(cfg)(**layer, name="layers_shared")
            blocks = [block] * self.num_layers
        else:
            shared_attention = shared_mlp = None
            if cfg.share_layers == "attention":
                shared_attention = make_attention(cfg, name="shared_attention")
            if cfg.share_layers == "ffn":
                shared_mlp = make_mlp(cfg, name="shared_mlp")
            blocks = [
                rematted(cfg)(
                    **layer, attention=shared_attention, mlp=shared_mlp, name=f"layers_{i}"
                )
                for i in range(self.num_layers)
            ]
        new_cache = {}
        for i, block in enumerate(blocks):
            penultimate_BLD = x_BLD
            if cache is None:
                x_BLD = block(x_BLD, *inputs)
            else:
                x_BLD, new_cache[f"layers_{i}"] = block(
                    x_BLD, *inputs, cache=cache[f"layers_{i}"], cache_index=cache_index
                )
        if cfg.final_norm:
            x_BLD = make_norm(
                cfg.norm_type,
                eps=cfg.norm_eps,
                use_bias=cfg.use_bias,
                dtype=cfg.compute_dtype,
                name="final_norm",
            )(x_BLD)
            x_BLD = nn.Dropout(cfg.dropout_rate)(x_BLD, deterministic=deterministic)
        if cfg.emd_layers:
            emd = EnhancedMaskDecoder(config=cfg, layer=blocks[-1], name="enhanced_mask_decoder")
            kwargs = dict(mask=mask, attention_kwargs=attention_kwargs)
            return x_BLD, emd(penultimate_BLD, position_ids_BL=position_ids_BL, **kwargs)
        return x_BLD if cache is None else (x_BLD, new_cache)


class Layer(Block):
    """A `Block` as a stack runs it: `deterministic` is fixed when the layer is built and the
    inputs are positional, so that every call argument is an array or None, which nn.remat can
    trace and nn.scan's in_axes can name. The parameters are the Block's."""

    deterministic: bool = True

    def __call__(
        self,
        x_BLD,
        mask=None,
        bias_BHLM=None,
        encoded_BMD=None,
        cross_mask=None,
        attention_kwargs=None,
        mask_layout=None,
        cross_mask_layout=None,
        *,
        cache=None,
        cache_index=None,
        kv_BLD=None,
    ):
        return super().__call__(
            x_BLD,
            mask=mask,
            bias_BHLM=bias_BHLM,
            encoded_BMD=encoded_BMD,
            cross_mask=cross_mask,
            attention_kwargs=attention_kwargs,
            mask_layout=mask_layout,
            cross_mask_layout=cross_mask_layout,
            deterministic=self.deterministic,
            cache=cache,
            cache_index=cache_index,
            kv_BLD=kv_BLD,
        )


class _ScanBody(Layer):
    """A `Layer` as nn.scan's body: (carry x_BLD, broadcast inputs) -> (x_BLD, no output)."""

    def __call__(self, x_BLD, *inputs):
        return super().__call__(x_BLD, *inputs), None


# ModelConfig.remat -> what a block saves for the backward pass (see ModelConfig's "layers").
_REMAT_POLICIES = {
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}


def rematted(config: ModelConfig, layer=Layer, *, prevent_cse: bool = True, static_argnums=()):
    """The module class `layer`, or `layer` under nn.remat with the config's policy
    (`static_argnums` count `self` as 0, as flax's do)."""
    if config.remat == "none":
        return layer
    return nn.remat(
        layer,
        policy=_REMAT_POLICIES[config.remat],
        prevent_cse=prevent_cse,
        static_argnums=static_argnums,
    )


def _scanned(config: ModelConfig, num_layers: int):
    """One (rematted) block scanned `num_layers` times: every variable gains a leading "layers"
    axis, each layer draws its own "params" and "dropout" keys, and the masks, the position
    bias, the encoder output, DeBERTa's relative terms and the mask layouts reach every layer
    unchanged."""
    # Inside a scan the loop itself keeps XLA from merging the recomputation into the forward
    # pass, which is what prevent_cse guards against (flax's nn.remat docstring).
    body = rematted(config, _ScanBody, prevent_cse=False)
    return nn.scan(
        body,
        variable_axes={True: 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * 7,  # Layer's inputs after x_BLD
        length=num_layers,
        metadata_params={nn.PARTITION_NAME: P.LAYERS},
    )


def _cached_relative_bias(relative_bias: RelativePositionBias, cache, length: int, cache_index):
    """T5's causal bias of queries at [cache_index, cache_index + L) over the M cached keys.

    Causal buckets depend on the distance query - key >= 0 only (later keys share bucket 0 and
    are masked anyway), so the module is asked once for the M distances 0..M-1 (queries
    0..M-1 against key 0) and each (query, key) pair gathers its distance: (1, H, L, M).
    """
    cached_length = cache_length(cache)
    by_distance_HM = relative_bias(cached_length, 1)[0, :, :, 0]
    query_L1 = cache_index + jnp.arange(length)[:, None]
    distance_LM = jnp.clip(query_L1 - jnp.arange(cached_length)[None, :], 0, cached_length - 1)
    return jnp.take(by_distance_HM, distance_LM, axis=1)[None]


def init_cache(config: ModelConfig, *, num_layers: int, batch_size: int, length: int) -> dict:
    """An empty cache of a causal stack: {"layers_{i}": {"attention": {"key", "value"}}}, each
    (batch_size, length, H, K) zeros in the compute dtype."""
    return {
        f"layers_{i}": {
            "attention": init_kv_cache(
                batch_size, length, config.num_heads, config.head_width, config.compute_dtype
            )
        }
        for i in range(num_layers)
    }


def cache_length(cache) -> int:
    """M, the positions a cache holds."""
    return cache["layers_0"]["attention"]["key"].shape[1]


def cached_causal_mask(length, cached_length, cache_index, *, attention_mask, prefix_mask):
    """(B or 1, 1, L, M): queries at [cache_index, cache_index + L) over the M cached keys.

    Causal over cache positions; `attention_mask` (B, M) hides padded keys; `prefix_mask`
    (B, M) makes the prefix bidirectional, as `masks.prefix_lm_mask` does without a cache.
    """
    for name, x in (("attention_mask", attention_mask), ("prefix_mask", prefix_mask)):
        if x is not None and (x.ndim != 2 or x.shape[1] != cached_length):
            raise ValueError(
                f"with a cache, {name} must be (B, {cached_length}) over the cached positions, "
                f"got {tuple(x.shape)}"
            )
    query_L = cache_index + jnp.arange(length)
    order = (jnp.arange(cached_length)[None, :] <= query_L[:, None])[None, None]
    if prefix_mask is not None:
        p_BM = prefix_mask.astype(bool)
        p_BL = jax.lax.dynamic_slice_in_dim(p_BM, cache_index, length, axis=1)
        order = order | (p_BL[:, :, None] & p_BM[:, None, :])[:, None]
    pad = None if attention_mask is None else masks.padding_mask(attention_mask)
    return masks.combine(pad, order)
