"""ELECTRA's pretraining model (Clark et al. 2020): a small MLM generator and a replaced-token
discriminator that share one embedding layer, trained together in one step.

The config (`ModelConfig` with `electra=ElectraOptions(...)`, heads ("mlm", "rtd")) gives the
discriminator's sizes; `generator_config` derives the generator. One call

    masked input_ids --shared embeddings--> generator --> mlm_logits at masked_positions
    sample from softmax(mlm_logits / T) (no gradient) --> scatter the samples into input_ids
    corrupted_ids --shared embeddings--> discriminator --> rtd_logits over every token

Parameters: `token_embedder` and `embedder` (positions, types, embedding norm) are shared, as
google-research/electra shares its whole "electra/embeddings" scope (untied_generator=True,
untied_generator_embeddings=False); `generator/` and `discriminator/` each hold their own E -> D
`embedding_projection` (where E != D), `encoder` and head (`mlm_head`, `rtd_head`).
`discriminator_params` lays out the discriminator as a plain `Transformer` to fine-tune.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lmsuite import partitioning as P
from lmsuite.layers import masks
from lmsuite.layers.dense import DenseGeneral, default_kernel_init
from lmsuite.models.config import ModelConfig
from lmsuite.models.embedder import Embedder, make_token_embedder
from lmsuite.models.heads import ReplacedTokenHead, VocabHead, gather_positions
from lmsuite.models.inputs import validate_inputs
from lmsuite.models.stack import Stack

# Embedding options the shared embedding layer does not take (it stops at width E).
_UNSUPPORTED = dict(
    scale_embeddings=False,
    embedding_projection_first=False,
    mask_padded_embeddings=False,
)


def _check(config: ModelConfig):
    if config.electra is None:
        raise ValueError("an ELECTRA pretrainer needs ModelConfig.electra=ElectraOptions(...)")
    for name, value in _UNSUPPORTED.items():
        if getattr(config, name) != value:
            raise ValueError(
                f"ModelConfig.electra needs ModelConfig.{name}={value!r}, got "
                f"{getattr(config, name)!r}"
            )


def generator_config(config: ModelConfig) -> ModelConfig:
    """The generator: d_model, heads and d_ff scaled by generator_hidden_fraction, layers by
    generator_layer_fraction, the discriminator's embedding width E, the "mlm" head.

    Example: ELECTRA-Base (D 768, 12 heads, F 3072, E 768) at 1/3 -> D 256, 4 heads, F 1024, E 768.
    """
    _check(config)
    opts = config.electra
    d_model = max(1, round(config.d_model * opts.generator_hidden_fraction))
    scale = d_model / config.d_model
    return config.replace(
        d_model=d_model,
        num_heads=max(1, round(config.num_heads * scale)),
        head_dim=None,
        d_ff=max(1, round(config.d_ff * scale)),
        num_layers=max(1, round(config.num_layers * opts.generator_layer_fraction)),
        embedding_dim=config.embed_width,
        heads=("mlm",),
        electra=None,
    )


def discriminator_config(config: ModelConfig) -> ModelConfig:
    """The discriminator as a plain encoder with the "rtd" head (what `discriminator_params`
    fits)."""
    _check(config)
    return config.replace(heads=("rtd",), electra=None)


def _shared_embedding_config(config: ModelConfig) -> ModelConfig:
    # An Embedder whose output width is E: no projection, which each tower applies itself.
    return config.replace(
        d_model=config.embed_width,
        embedding_dim=None,
        num_heads=1,
        head_dim=None,
        project_embeddings=False,
        heads=("rtd",),
        electra=None,
    )


class _Tower(nn.Module):
    """x_BLE from the shared embeddings -> its own E -> D projection -> encoder -> its head.

    Returns (head logits, hidden_BLD): the generator's `mlm_head` (at masked_positions when
    given) or the discriminator's `rtd_head`.
    """

    config: ModelConfig
    token_embedder: nn.Module

    @nn.compact
    def __call__(self, x_BLE, *, mask, mask_layout=None, masked_positions=None, deterministic):
        cfg = self.config
        if cfg.embed_width != cfg.d_model or cfg.project_embeddings:
            x_BLE = DenseGeneral(
                (cfg.d_model,),
                (P.EMBED,),
                (P.MLP,),
                use_bias=cfg.embedding_projection_bias,
                kernel_init=default_kernel_init(cfg.init_stddev),
                dtype=cfg.compute_dtype,
                name="embedding_projection",
            )(x_BLE)
            x_BLE = nn.with_logical_constraint(x_BLE, (P.BATCH, P.LENGTH, P.EMBED))
        hidden = Stack(config=cfg, num_layers=cfg.num_layers, name="encoder")(
            x_BLE, mask=mask, mask_layout=mask_layout, deterministic=deterministic
        )
        if cfg.heads == ("mlm",):
            h = hidden if masked_positions is None else gather_positions(hidden, masked_positions)
            head = VocabHead(
                config=cfg,
                token_embedder=self.token_embedder,
                transform=cfg.mlm_transform,
                name="mlm_head",
            )
            return head(h), hidden
        return ReplacedTokenHead(config=cfg, name="rtd_head")(hidden), hidden


def sample_ids(key, logits_BPV, *, temperature: float = 1.0):
    """One draw per row from softmax(logits / temperature) by the Gumbel-max trick, without a
    gradient (the reference's `sample_from_softmax` under `stop_gradient`)."""
    logits = jax.lax.stop_gradient(logits_BPV).astype(jnp.float32) / temperature
    gumbel = jax.random.gumbel(key, logits.shape, jnp.float32)
    return jnp.argmax(logits + gumbel, axis=-1).astype(jnp.int32)


def scatter_positions(ids_BL, positions_BP, values_BP, valid_BP):
    """ids with `values` written at the valid `positions`; invalid slots write nothing.

    >>> scatter_positions(jnp.array([[5, 6, 7]]), jnp.array([[2, 0]]), jnp.array([[9, 8]]),
    ...                   jnp.array([[True, False]]))
    Array([[5, 6, 9]], dtype=int32)
    """
    length = ids_BL.shape[1]
    rows_BP = jnp.broadcast_to(jnp.arange(ids_BL.shape[0])[:, None], positions_BP.shape)
    # An out-of-range position is dropped: padded prediction slots (position 0) change nothing.
    target_BP = jnp.where(valid_BP, positions_BP.astype(jnp.int32), length)
    return (
        jnp.asarray(ids_BL).at[rows_BP, target_BP].set(values_BP.astype(ids_BL.dtype), mode="drop")
    )


class ElectraPretrainer(nn.Module):
    """Masked ids -> generator `mlm_logits` (B, P, V), `sampled_ids` (B, P), the discriminator's
    input `corrupted_ids` (B, L), its `rtd_logits` (B, L) and `hidden` (B, L, D).

    Sampling takes the "sample" rng (`init` uses "params"). Slots with masked_weights == 0 are
    left as they are. Without masked_positions the generator's logits cover every position and
    nothing is replaced (the discriminator reads input_ids).
    """

    config: ModelConfig

    @nn.compact
    def __call__(
        self,
        input_ids,
        *,
        attention_mask=None,
        token_type_ids=None,
        masked_positions=None,
        masked_weights=None,
        deterministic: bool = True,
    ) -> dict[str, jax.Array]:
        cfg = self.config
        validate_inputs(cfg, input_ids, token_type_ids=token_type_ids)
        gen_cfg, disc_cfg = generator_config(cfg), discriminator_config(cfg)
        if attention_mask is not None and attention_mask.ndim != 2:
            raise ValueError(
                f"ELECTRA takes a (B, L) attention_mask, got {tuple(attention_mask.shape)}"
            )
        if masked_weights is not None and (
            masked_positions is None or masked_weights.shape != masked_positions.shape
        ):
            raise ValueError(
                "masked_weights needs masked_positions of its shape, got "
                f"{tuple(masked_weights.shape)} and "
                f"{None if masked_positions is None else tuple(masked_positions.shape)}"
            )
        token_embedder = make_token_embedder(disc_cfg)
        embedder = Embedder(
            config=_shared_embedding_config(cfg), token_embedder=token_embedder, name="embedder"
        )
        mask = None if attention_mask is None else masks.padding_mask(attention_mask)
        layout = None
        if cfg.attention_impl == "fused":
            layout = masks.segment_layout(key_valid_BM=attention_mask, length=input_ids.shape[1])

        def embed(ids):
            return embedder(ids, type_ids_BL=token_type_ids, deterministic=deterministic)

        generator = _Tower(config=gen_cfg, token_embedder=token_embedder, name="generator")
        mlm_logits, _ = generator(
            embed(input_ids),
            mask=mask,
            mask_layout=layout,
            masked_positions=masked_positions,
            deterministic=deterministic,
        )

        outputs = {"mlm_logits": mlm_logits}
        corrupted = input_ids
        if masked_positions is not None:
            if self.is_initializing() and not self.has_rng("sample"):
                key = self.make_rng("params")
            elif not self.has_rng("sample"):
                raise ValueError(
                    "ELECTRA samples its replacements: apply it with rngs={'sample': key}"
                )
            else:
                key = self.make_rng("sample")
            sampled = sample_ids(key, mlm_logits, temperature=cfg.electra.temperature)
            valid = (
                jnp.ones(masked_positions.shape, bool)
                if masked_weights is None
                else masked_weights > 0
            )
            corrupted = scatter_positions(input_ids, masked_positions, sampled, valid)
            outputs["sampled_ids"] = sampled
        outputs["corrupted_ids"] = corrupted

        discriminator = _Tower(config=disc_cfg, token_embedder=token_embedder, name="discriminator")
        outputs["rtd_logits"], outputs["hidden"] = discriminator(
            embed(corrupted), mask=mask, mask_layout=layout, deterministic=deterministic
        )
        return outputs


def discriminator_params(params: dict) -> dict:
    """The discriminator's parameters laid out as `Transformer(discriminator_config(config))`'s,
    for fine-tuning or conversion; the generator's are dropped."""
    disc = dict(params["discriminator"])
    embedder = dict(params["embedder"])
    if "embedding_projection" in disc:
        embedder["embedding_projection"] = disc.pop("embedding_projection")
    return {"token_embedder": params["token_embedder"], "embedder": embedder, **disc}


def recipe_problems(config: ModelConfig, lengths=None) -> list[str]:
    """What stops `config` from training the `electra` recipe beyond its architecture and heads
    (`lmsuite.training.recipes`' check_model)."""
    del lengths  # any MLM lengths fit
    if config.electra is None:
        return [
            "the electra recipe trains a generator and a discriminator together: set "
            "ModelConfig.electra = @ElectraOptions() (e.g. lmsuite/gin/models/electra_tiny.gin)"
        ]
    try:
        _check(config)
        generator_config(config)
    except ValueError as error:
        return [str(error)]
    return []
