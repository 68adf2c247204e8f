"""`EncoderDecoderModel`: a bidirectional encoder and a causal decoder with cross-attention
(T5, BART, MASS), trained through `__call__`, decoded step by step through `decode`, and read
by the classification probes through `encode` (the encoder alone).

Parameters: `token_embedder` (shared), `encoder_embedder`, `encoder`, `decoder_embedder`,
`decoder`, and `lm_head` / `classifier`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lmsuite.layers import masks
from lmsuite.models import stack
from lmsuite.models.config import ModelConfig
from lmsuite.models.embedder import Embedder, make_token_embedder
from lmsuite.models.heads import Classifier, VocabHead
from lmsuite.models.inputs import (
    check_ids,
    check_length,
    check_same_shape,
    self_attention_layout,
    self_attention_mask,
    validate_inputs,
)
from lmsuite.models.stack import Stack


class EncoderDecoderModel(nn.Module):
    """(input_ids, decoder_input_ids) -> {"hidden" (the decoder's), "lm_logits" (B, L_dec, V),
    "classifier_logits"}; `decode` adds "cache"."""

    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.token_embedder = make_token_embedder(cfg)
        self.encoder_embedder = Embedder(config=cfg, token_embedder=self.token_embedder)
        self.encoder = Stack(config=cfg, num_layers=cfg.num_layers, causal=False)
        self.decoder_embedder = Embedder(
            config=cfg, token_embedder=self.token_embedder, use_types=False
        )
        self.decoder = Stack(config=cfg, num_layers=cfg.decoder_layers, causal=True, has_cross=True)
        if "lm" in cfg.heads:
            self.lm_head = VocabHead(
                config=cfg, token_embedder=self.token_embedder, transform=False
            )
        if "classifier" in cfg.heads:
            self.classifier = Classifier(config=cfg)

    def _heads(self, hidden, deterministic):
        outputs = {"hidden": hidden}
        if "lm" in self.config.heads:
            outputs["lm_logits"] = self.lm_head(hidden)
        if "classifier" in self.config.heads:
            outputs["classifier_logits"] = self.classifier(hidden, deterministic=deterministic)
        return outputs

    def _encode(self, input_ids, attention_mask, position_ids, segment_ids, deterministic):
        cfg = self.config
        x = self.encoder_embedder(
            input_ids, position_ids_BL=position_ids, deterministic=deterministic
        )
        enc_inputs = dict(
            attention_mask=attention_mask, segment_ids=segment_ids, causal=False, prefix_mask=None
        )
        return self.encoder(
            x,
            mask=self_attention_mask(cfg, input_ids.shape[1], **enc_inputs),
            mask_layout=self_attention_layout(cfg, input_ids.shape[1], **enc_inputs),
            deterministic=deterministic,
        )

    def encode(self, input_ids, *, attention_mask=None, deterministic: bool = True) -> jax.Array:
        """The encoder stack's final states (B, L, D) of `input_ids`, the decoder untouched:
        what a classification probe reads (`lmsuite.evaluation.probe_models`). Initialised
        through this method, the tree holds the shared and encoder parameters only, at the
        paths `__call__` gives them.

        Args:
          input_ids: (B, L) the encoder's token ids.
          attention_mask: (B, L) 1 for the real tokens.
          deterministic: False enables dropout (needs a "dropout" rng).
        """
        validate_inputs(self.config, input_ids)
        if attention_mask is not None:
            check_same_shape("attention_mask", attention_mask, "input_ids", input_ids)
        return self._encode(input_ids, attention_mask, None, None, deterministic)

    def __call__(
        self,
        input_ids,
        *,
        attention_mask=None,
        position_ids=None,
        segment_ids=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        decoder_position_ids=None,
        decoder_segment_ids=None,
        cross_attention_mask=None,
        deterministic: bool = True,
    ) -> dict[str, jax.Array]:
        """Runs the encoder over the inputs and the decoder over its own inputs.

        Args:
          input_ids: (B, L) the encoder's token ids.
          attention_mask: (B, L) 1 for the encoder's real tokens.
          position_ids: (B, L) 0-based positions (packing restarts them); default arange.
          segment_ids: (B, L) packed-example ids (> 0); attention stays within a segment.
          decoder_*: the same for the decoder (decoder_input_ids (B, L_dec) is required).
          cross_attention_mask: (B, L) 1 on the encoder positions the decoder may attend to,
            on top of padding and segments (MASS hides the encoder's [MASK] positions).
          deterministic: False enables dropout (needs a "dropout" rng).
        """
        cfg = self.config
        if decoder_input_ids is None:
            raise ValueError("architecture='encoder_decoder' needs decoder_input_ids (B, L_dec)")
        validate_inputs(
            cfg,
            input_ids,
            position_ids=position_ids,
            segment_ids=segment_ids,
            decoder_input_ids=decoder_input_ids,
        )
        if attention_mask is not None and attention_mask.ndim != 2:
            raise ValueError(
                f"encoder attention_mask must be (B, L), got {tuple(attention_mask.shape)}"
            )
        encoded = self._encode(input_ids, attention_mask, position_ids, segment_ids, deterministic)
        y = self.decoder_embedder(
            decoder_input_ids, position_ids_BL=decoder_position_ids, deterministic=deterministic
        )
        dec_length = decoder_input_ids.shape[1]
        dec_inputs = dict(
            attention_mask=decoder_attention_mask,
            segment_ids=decoder_segment_ids,
            causal=True,
            prefix_mask=None,
        )
        if cross_attention_mask is not None:
            check_same_shape("cross_attention_mask", cross_attention_mask, "input_ids", input_ids)
        cross_mask = masks.combine(
            None if attention_mask is None else masks.padding_mask(attention_mask),
            None if cross_attention_mask is None else masks.padding_mask(cross_attention_mask),
            None
            if decoder_segment_ids is None or segment_ids is None
            else masks.segment_mask(decoder_segment_ids, segment_ids),
        )
        cross_layout = None
        if cfg.attention_impl == "fused":
            both_segments = decoder_segment_ids is not None and segment_ids is not None
            cross_layout = masks.segment_layout(
                key_valid_BM=masks.combine(attention_mask, cross_attention_mask),
                q_segment_ids_BL=decoder_segment_ids if both_segments else None,
                kv_segment_ids_BM=segment_ids if both_segments else None,
                length=dec_length,
            )
        hidden = self.decoder(
            y,
            mask=self_attention_mask(cfg, dec_length, **dec_inputs),
            mask_layout=self_attention_layout(cfg, dec_length, **dec_inputs),
            encoded_BMD=encoded,
            cross_mask=cross_mask,
            cross_mask_layout=cross_layout,
            deterministic=deterministic,
        )
        return self._heads(hidden, deterministic)

    def decode(
        self,
        input_ids,
        *,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_position_ids=None,
        cache=None,
        cache_index=None,
        deterministic: bool = True,
    ) -> dict[str, jax.Array]:
        """One cached decoding call: the decoder over L new positions.

        Args:
          input_ids: (B, L_enc) the encoder's ids on the first call (which writes each layer's
            "cross_attention" keys/values into the cache); None on later calls.
          attention_mask: (B, L_enc) 1 on the encoder's real tokens, on every call.
          decoder_input_ids: (B, L) the new decoder tokens, at positions [cache_index,
            cache_index + L) of the cache; decoder_position_ids default to those.
          cache: from `families.init_cache` or a previous call's outputs["cache"].
          cache_index: int32 scalar, the first position the inputs are written to.
          deterministic: False enables dropout (needs a "dropout" rng).
        """
        cfg = self.config
        if decoder_input_ids is None:
            raise ValueError("architecture='encoder_decoder' needs decoder_input_ids")
        if cache is None or cache_index is None:
            raise ValueError(
                "decode needs cache (families.init_cache) and cache_index, the position the "
                "inputs are written to"
            )
        check_ids("decoder_input_ids", decoder_input_ids, cfg.vocab_size)
        encoded = None
        if "cross_attention" not in cache["layers_0"]:
            if input_ids is None:
                raise ValueError("the first cached step of an encoder-decoder needs input_ids")
            check_ids("input_ids", input_ids, cfg.vocab_size)
            check_length(cfg, "input_ids", input_ids.shape[1])
            x = self.encoder_embedder(input_ids, deterministic=deterministic)
            enc_mask = None if attention_mask is None else masks.padding_mask(attention_mask)
            encoded = self.encoder(x, mask=enc_mask, deterministic=deterministic)
        elif input_ids is not None:
            raise ValueError("the encoder output is cached already: pass input_ids=None")
        cross_mask = None if attention_mask is None else masks.padding_mask(attention_mask)
        ids = decoder_input_ids
        self_mask = stack.cached_causal_mask(
            ids.shape[1],
            stack.cache_length(cache),
            cache_index,
            attention_mask=None,
            prefix_mask=None,
        )
        positions = decoder_position_ids
        if positions is None:
            positions = (cache_index + jnp.arange(ids.shape[1]))[None, :]
        y = self.decoder_embedder(ids, position_ids_BL=positions, deterministic=deterministic)
        hidden, new_cache = self.decoder(
            y,
            mask=self_mask,
            encoded_BMD=encoded,
            cross_mask=cross_mask,
            deterministic=deterministic,
            cache=cache,
            cache_index=cache_index,
        )
        return self._heads(hidden, deterministic) | {"cache": new_cache}
