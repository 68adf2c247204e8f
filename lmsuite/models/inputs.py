"""Checks of the models' inputs (ids in range, shapes that agree, lengths the position table
holds) and the self-attention mask they build from them, shared by the family modules."""

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.layers import masks
from lmsuite.models.config import ABSOLUTE_INPUT_POSITIONS, ModelConfig


def _is_concrete(x) -> bool:
    return x is not None and not isinstance(x, jax.core.Tracer)


def check_ids(name: str, ids, limit: int):
    """Rank, dtype and (when the values are known, i.e. outside jit) range of an id array."""
    if ids.ndim != 2:
        raise ValueError(f"{name} must be (batch, length), got shape {tuple(ids.shape)}")
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"{name} must hold integers, got dtype {ids.dtype}")
    if _is_concrete(ids) and ids.size:
        values = np.asarray(ids)
        lo, hi = int(values.min()), int(values.max())
        if lo < 0 or hi >= limit:
            bad = hi if hi >= limit else lo
            raise ValueError(f"{name} holds id {bad}, outside [0, {limit})")


def check_same_shape(name: str, x, ref_name: str, ref):
    if x is not None and tuple(x.shape) != tuple(ref.shape):
        raise ValueError(
            f"{name} must have the shape of {ref_name} {tuple(ref.shape)}, got {tuple(x.shape)}"
        )


def reads_position_table(config: ModelConfig) -> bool:
    """Whether the position ids index a table of `max_positions` rows (a learned or sinusoidal
    one, TUPE's, or DeBERTa's absolute one with position_biased_input): an id past it would be
    clamped by XLA's gather without a word."""
    biased = config.deberta is not None and config.deberta.position_biased_input
    return config.position_type in (*ABSOLUTE_INPUT_POSITIONS, "tupe") or biased


def position_limit(config: ModelConfig) -> int | None:
    """The longest sequence the model's position tables can index, or None where no table
    bounds it (T5's buckets, DeBERTa's clamped distances and XLNet's sinusoids take any length).
    DeBERTa's enhanced mask decoder adds its own table of max_length absolute positions."""
    limits = [config.max_positions] if reads_position_table(config) else []
    if config.deberta is not None and config.deberta.emd_layers > 0:
        limits.append(config.max_length)
    return min(limits, default=None)


def check_position_ids(config: ModelConfig, position_ids):
    """Range of given position ids (when concrete) where they index the position table."""
    if not (reads_position_table(config) and _is_concrete(position_ids) and position_ids.size):
        return
    values = np.asarray(position_ids)
    lo, hi = int(values.min()), int(values.max())
    if lo < 0 or hi >= config.max_positions:
        raise ValueError(
            f"position_ids holds {hi if hi >= config.max_positions else lo}, outside "
            f"[0, {config.max_positions}): the position table (position_type="
            f"{config.position_type!r}, max_length={config.max_length} - position_offset="
            f"{config.position_offset}) has {config.max_positions} positions"
        )


def check_length(config: ModelConfig, name: str, length: int):
    if reads_position_table(config) and length > config.max_positions:
        raise ValueError(
            f"{name} has length {length}, longer than the position table "
            f"(max_length={config.max_length} - position_offset={config.position_offset} "
            f"= {config.max_positions} positions)"
        )


def validate_inputs(
    config: ModelConfig,
    input_ids,
    *,
    token_type_ids=None,
    position_ids=None,
    segment_ids=None,
    decoder_input_ids=None,
):
    """Raises ValueError for token inputs a single- or two-stack model cannot take; id ranges
    are checked when concrete (outside jit)."""
    cfg = config
    check_ids("input_ids", input_ids, cfg.vocab_size)
    check_length(cfg, "input_ids", input_ids.shape[1])
    if token_type_ids is not None:
        if cfg.type_vocab_size == 0:
            raise ValueError("token_type_ids given, but the config has type_vocab_size=0")
        check_ids("token_type_ids", token_type_ids, cfg.type_vocab_size)
        check_same_shape("token_type_ids", token_type_ids, "input_ids", input_ids)
    for name, x in (("position_ids", position_ids), ("segment_ids", segment_ids)):
        check_same_shape(name, x, "input_ids", input_ids)
    check_position_ids(cfg, position_ids)
    if decoder_input_ids is not None:
        check_ids("decoder_input_ids", decoder_input_ids, cfg.vocab_size)
        check_length(cfg, "decoder_input_ids", decoder_input_ids.shape[1])


def self_attention_mask(
    config: ModelConfig, length: int, *, attention_mask, segment_ids, causal, prefix_mask
):
    """The (B, 1, L, L) mask of one stack's self-attention: padding (or a full (B, L, L)
    mask), causal order or a bidirectional prefix, and packed segments."""
    pad = None
    if attention_mask is not None:
        if attention_mask.shape[1] != length or attention_mask.shape[-1] != length:
            raise ValueError(
                f"attention_mask must be (B, {length}) or (B, {length}, {length}), "
                f"got {tuple(attention_mask.shape)}"
            )
        if attention_mask.ndim == 3:
            pad = masks.full_mask(attention_mask)
        elif config.mask_padded_queries:
            pad = masks.query_key_padding_mask(attention_mask)
        else:
            pad = masks.padding_mask(attention_mask)
    order = None
    if prefix_mask is not None:
        order = masks.prefix_lm_mask(prefix_mask)
    elif causal:
        order = masks.causal_mask(length)
    seg = None if segment_ids is None else masks.segment_mask(segment_ids, segment_ids)
    return masks.combine(pad, order, seg)


def self_attention_layout(
    config: ModelConfig, length: int, *, attention_mask, segment_ids, causal, prefix_mask
) -> masks.MaskLayout | None:
    """The structure of `self_attention_mask`'s mask for attention_impl "fused" (None for
    "plain"); a mask without one (prefix LM, a full mask, padded queries) says why."""
    if config.attention_impl != "fused":
        return None
    if prefix_mask is not None:
        return masks.unfusable_layout(
            "a prefix-LM mask (a bidirectional prefix of per-example length) has no fused layout"
        )
    if attention_mask is not None and attention_mask.ndim == 3:
        return masks.unfusable_layout("a full (B, L, L) attention mask (UniLM) has no fused layout")
    if attention_mask is not None and config.mask_padded_queries:
        return masks.unfusable_layout(
            "mask_padded_queries (padded queries attend to nothing) has no fused layout"
        )
    return masks.segment_layout(
        key_valid_BM=attention_mask,
        q_segment_ids_BL=segment_ids,
        kv_segment_ids_BM=segment_ids,
        length=length,
        causal=causal,
    )


def refuse_given(inputs: dict, what: str):
    given = sorted(name for name, x in inputs.items() if x is not None)
    if given:
        raise ValueError(f"{what} does not take {given}")
