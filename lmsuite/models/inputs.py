"""Checks of the Transformer's inputs (ids in range, shapes that agree, lengths the position
table holds) and the key/value cache layout of cached decoding: everything `Transformer` verifies
or allocates before it runs."""

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.models import stack
from lmsuite.models.config import ModelConfig
from lmsuite.models.two_stream import validate_inputs as validate_two_stream_inputs


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


def check_length(config: ModelConfig, name: str, length: int):
    if config.position_type in ("learned", "sinusoidal") and length > config.max_positions:
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
    prefix_mask=None,
    decoder_input_ids=None,
):
    """Raises ValueError for inputs the model cannot take; id ranges are checked when concrete."""
    cfg = config
    if cfg.architecture == "xlnet":
        others = dict(position_ids=position_ids, segment_ids=segment_ids, prefix_mask=prefix_mask)
        others["decoder_input_ids"] = decoder_input_ids
        refuse_given(others, "architecture='xlnet'")
        validate_two_stream_inputs(cfg, input_ids, token_type_ids=token_type_ids)
        return
    check_ids("input_ids", input_ids, cfg.vocab_size)
    check_length(cfg, "input_ids", input_ids.shape[1])
    if token_type_ids is not None:
        if cfg.type_vocab_size == 0:
            raise ValueError("token_type_ids given, but the config has type_vocab_size=0")
        check_ids("token_type_ids", token_type_ids, cfg.type_vocab_size)
        check_same_shape("token_type_ids", token_type_ids, "input_ids", input_ids)
    for name, x in (("position_ids", position_ids), ("segment_ids", segment_ids)):
        check_same_shape(name, x, "input_ids", input_ids)
    if prefix_mask is not None and cfg.architecture != "prefix_lm":
        raise ValueError(f"prefix_mask is for architecture='prefix_lm', not {cfg.architecture!r}")
    if cfg.architecture == "prefix_lm" and prefix_mask is None:
        raise ValueError("architecture='prefix_lm' needs prefix_mask (B, L)")

    if decoder_input_ids is not None:
        if cfg.architecture != "encoder_decoder":
            raise ValueError(f"decoder_input_ids given to architecture={cfg.architecture!r}")
        check_ids("decoder_input_ids", decoder_input_ids, cfg.vocab_size)
        check_length(cfg, "decoder_input_ids", decoder_input_ids.shape[1])


DECODING_ARCHITECTURES = ("decoder", "prefix_lm", "encoder_decoder")


def init_cache(config: ModelConfig, *, batch_size: int, length: int) -> dict:
    """An empty key/value cache of the decoder stack for `length` positions (`stack.init_cache`).

    An encoder-decoder's first cached call adds each layer's "cross_attention" keys/values of
    the encoder output; later calls then skip the encoder and take input_ids=None.
    """
    if config.architecture not in DECODING_ARCHITECTURES:
        raise ValueError(
            f"architecture={config.architecture!r} cannot decode with a cache; expected one of "
            f"{DECODING_ARCHITECTURES}"
        )
    encoder_decoder = config.architecture == "encoder_decoder"
    return stack.init_cache(
        config,
        num_layers=config.decoder_layers if encoder_decoder else config.num_layers,
        batch_size=batch_size,
        length=length,
    )


def refuse_given(inputs: dict, what: str):
    given = sorted(name for name, x in inputs.items() if x is not None)
    if given:
        raise ValueError(f"{what} does not take {given}")
